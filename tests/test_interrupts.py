"""Signals are held inside ``deferred()`` blocks and raised right after them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from trtllm_kit.interrupts import Interrupts


@pytest.fixture
def interrupts() -> Iterator[Interrupts]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    handler = Interrupts()
    handler.install()
    yield handler
    for signum, previous in saved.items():
        signal.signal(signum, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_outside_a_deferred_block_interrupts_at_once(interrupts: Interrupts, signum: int) -> None:
    with pytest.raises(KeyboardInterrupt, match=signal.Signals(signum).name):
        os.kill(os.getpid(), signum)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass


def test_signal_inside_a_deferred_block_waits_for_its_end(interrupts: Interrupts) -> None:
    finished_inside = False
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), interrupts.deferred():
        with interrupts.deferred():  # nested blocks raise only when the outermost ends
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))
        sum(range(1000))
        finished_inside = True
    assert finished_inside


def test_a_deferred_block_without_a_signal_raises_nothing(interrupts: Interrupts) -> None:
    with interrupts.deferred():
        value = sum(range(10))
    assert value == 45


def test_a_ctrl_c_while_click_parses_the_arguments_is_the_interrupted_line(monkeypatch: pytest.MonkeyPatch,
                                                                             capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    """Click turns a KeyboardInterrupt in its argument parsing into ``Abort``: the command still ends with 130 and
    the one line every interrupted command ends with."""
    from trtllm_kit import cli

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.cli, "make_context", interrupted)
    assert cli.run(["models"]) == 130
    assert capsys.readouterr().err.rstrip().splitlines()[-1] == "Error: interrupted; nothing was written."
