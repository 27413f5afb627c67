"""Guides compiled in the worker process, for real: the hostile guides of the structured-output findings are
refused in one sentence naming the input; a guide that compiles for minutes is refused at the time bound and its
compile killed, while another guide compiles beside it; a compile that asks for more memory than the bound is
refused; refusals are kept, time-outs are not; and a process killed with SIGKILL leaves no compile running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import psutil
import pytest
from transformers import AutoTokenizer

from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.grammar import CompiledGuide, Guide, tokenizer_info
from trtllm_kit.runtime.guide_limits import GUIDE_COMPILE_MEMORY_BYTES, GUIDE_COMPILE_TIMEOUT_S, GuideRefused
from trtllm_kit.runtime.guide_service import GuideService
from trtllm_kit.runtime.guide_worker import GuideWorker, encode_frame, read_frame

pytestmark = pytest.mark.slow
pytest.importorskip("xgrammar")
WAIT_S = 180  # generous: a loaded machine is slow, a lost answer never comes
# An object of 3,000 optional properties: 29 kB, within the bounds, and minutes of compiling for xgrammar.
SLOW = json.dumps({"type": "object", "properties": {str(i): {} for i in range(3000)}}, separators=(",", ":"))
SERVICE = """
import json, sys, time
from transformers import AutoTokenizer
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.grammar import Guide, tokenizer_info
from trtllm_kit.runtime.guide_service import GuideService
tokenizer = AutoTokenizer.from_pretrained(str(builtin_dir("tiny-llama")))
service = GuideService(lambda: tokenizer_info(tokenizer, len(tokenizer), [tokenizer.eos_token_id]))
service.compile(Guide("json_schema", sys.argv[1]))
time.sleep(600)
"""


def workers(pid: int) -> list[psutil.Process]:
    """The guide worker processes under ``pid`` and their compile children."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "trtllm_kit.runtime.guide_worker" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def new_service() -> Iterator[GuideService]:
    tokenizer = AutoTokenizer.from_pretrained(str(builtin_dir("tiny-llama")))
    made = GuideService(lambda: tokenizer_info(tokenizer, len(tokenizer), [tokenizer.eos_token_id]))
    yield made
    made.close()


@pytest.fixture
def service() -> Iterator[GuideService]:
    """A service of the test's own: its worker and its kept guides are the test's."""
    yield from new_service()


@pytest.fixture(scope="module")
def refusing_service() -> Iterator[GuideService]:
    """One service, one worker, for the hostile guides: each is another guide, refused, and leaves the worker
    waiting for the next."""
    yield from new_service()


@pytest.mark.parametrize(("guide", "message"), [
    (Guide("ebnf_grammar", "root ::= nothere"), 'guided_decoding_guide (ebnf_grammar) cannot be compiled: EBNF parser '
     'error at line 1, column 10: Rule "nothere" is not defined; fix the guide.'),
    (Guide("json_schema", '{"$ref": "#"}'), "guided_decoding_guide (json_schema) cannot be compiled: Circular $ref "
     "chain with no schema content: # -> #; fix the guide."),
    (Guide("regex", "(" * 2000 + "a" + ")" * 2000), "guided_decoding_guide (regex) nests 2000 levels deep; a "
     "structured-output guide may nest at most 32: flatten it."),
    (Guide("ebnf_grammar", "root ::= " + "(" * 3000 + '"a"' + ")" * 3000), "guided_decoding_guide (ebnf_grammar) "
     "nests 3000 levels deep; a structured-output guide may nest at most 32: flatten it."),
    (Guide("json_schema", '{"type": "array", "items": ' * 999 + "{}" + "}" * 999), "guided_decoding_guide "
     "(json_schema) nests 1000 levels deep; a structured-output guide may nest at most 32: flatten it."),
], ids=["undefined-rule", "self-ref", "regex-2000-deep", "ebnf-3000-deep", "json-1000-deep"])
def test_hostile_guides_are_refused_naming_the_input(refusing_service: GuideService, guide: Guide,
                                                     message: str) -> None:
    with pytest.raises(GuideRefused) as refused:
        refusing_service.compile(guide).result(timeout=WAIT_S)
    assert str(refused.value) == message


def test_a_slow_guide_is_refused_at_the_time_bound_while_another_compiles(service: GuideService) -> None:
    others = {process.pid for process in workers(os.getpid())}  # workers of models earlier tests left running
    slow = service.compile(Guide("json_schema", SLOW))
    quick = service.compile(Guide("regex", "[a-c]{2}-[0-9]{3}"))
    assert isinstance(quick.result(timeout=WAIT_S), CompiledGuide)
    assert not slow.done()  # the quick guide did not wait for the slow one
    with pytest.raises(GuideRefused) as refused:
        slow.result(timeout=WAIT_S)
    assert str(refused.value) == (f"guided_decoding_guide (json_schema) did not compile within "
                                  f"{GUIDE_COMPILE_TIMEOUT_S:g} s, the bound on a guide's compile time: send a "
                                  "simpler guide.")
    worker = [process for process in workers(os.getpid()) if process.pid not in others]
    assert len(worker) == 1, worker  # the killed compile is gone; the worker waits for the next guide
    again = service.compile(Guide("json_schema", SLOW))
    assert not again.done()  # a time-out depends on the load: the guide is compiled again


def test_a_compile_past_the_memory_bound_is_refused() -> None:
    """The worker's compile child runs a compiler that asks for twice the bound (which the machine could give)."""

    def hog(_guide: Guide) -> SimpleNamespace:
        held = bytearray(2 * GUIDE_COMPILE_MEMORY_BYTES)
        return SimpleNamespace(to_json=lambda: str(len(held)))

    requests, answers = os.pipe(), os.pipe()
    worker = GuideWorker(requests[0], os.fdopen(answers[1], "wb"))
    worker.compiler = SimpleNamespace(compile=hog)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    os.write(requests[1], encode_frame({"id": 7, "guide_type": "regex", "guide": "a+"}))
    with os.fdopen(answers[0], "rb") as answer:
        assert read_frame(answer) == {"id": 7, "refused": "guided_decoding_guide (regex) needs more than 1024 MiB to "
                                      "compile, the bound on a guide's compile memory: send a simpler guide."}
    os.close(requests[1])
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_refusals_and_compiled_guides_are_kept(service: GuideService) -> None:
    malformed, regex = Guide("ebnf_grammar", "root ::= nothere"), Guide("regex", "[a-c]{2}")
    first = service.compile(regex)
    with pytest.raises(GuideRefused):
        service.compile(malformed).result(timeout=WAIT_S)
    again = service.compile(malformed)
    assert again.done() and isinstance(again.exception(), GuideRefused)
    assert service.compile(regex) is first and first.result(timeout=WAIT_S) is not None


def test_a_killed_owner_leaves_no_compile_running() -> None:
    owner = subprocess.Popen([sys.executable, "-c", SERVICE, SLOW])
    try:
        deadline = time.monotonic() + WAIT_S
        while len(workers(owner.pid)) < 2:  # the worker and the child compiling the slow guide
            assert owner.poll() is None and time.monotonic() < deadline, "the compile never started"
            time.sleep(0.1)
        left = workers(owner.pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        _, alive = psutil.wait_procs(left, timeout=30)
        assert not alive, alive
    finally:
        owner.kill()
        owner.wait()
