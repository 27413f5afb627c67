"""EngineLoop: requests submitted to its thread with recording handles, over the built-in tiny model (no Triton)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.handle import Failure
from trtllm_kit.runtime.loop import EngineLoop, Submission
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams, Sequence
from trtllm_kit.runtime.stats import ExecutorStats

torch.set_num_threads(1)
PROMPT = [5, 17, 301, 42, 7, 99]
WAIT_S = 120  # generous: the machine is shared; nothing here measures speed


class Recorder:
    """A handle that keeps what the loop told it; ``ended`` is set by the request's end."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.progress_ids: list[list[int]] = []
        self.finish_reasons: list[str | None] = []
        self.failures: list[tuple[str, Failure]] = []
        self.ended = threading.Event()
        self.cancel_after = cancel_after  # the client leaves after this many progress calls

    def progress(self, seq: Sequence, is_last: bool) -> None:
        self.progress_ids.append(list(seq.output_ids))
        self.finish_reasons.append(seq.finish_reason)
        if is_last:
            self.ended.set()

    def failed(self, message: str, kind: Failure) -> None:
        self.failures.append((message, kind))
        self.ended.set()

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.progress_ids) >= self.cancel_after

    def wait(self) -> Recorder:
        assert self.ended.wait(WAIT_S), "the request ended"
        return self


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root = tmp_path_factory.mktemp("ckpt") / "llama"
    convert_checkpoint(builtin_dir("tiny-llama"), root, tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(Path(root))


def _engine(model: CheckpointModel, **config: int) -> Executor:
    return Executor(model, EngineConfig(tokens_per_block=8, max_tokens_in_paged_kv_cache=512, **config))


def _blocked(loop: EngineLoop) -> threading.Event:
    """Hold the engine thread until the returned event is set (messages queue meanwhile)."""
    release = threading.Event()
    loop.call(lambda: release.wait(WAIT_S) and None)
    return release


def _running(loop: EngineLoop) -> int:
    done, counts = threading.Event(), []

    def count() -> None:
        counts.append(len(loop.engine.scheduler.running) + len(loop.engine.scheduler.waiting))
        done.set()

    loop.call(count)
    assert done.wait(WAIT_S)
    return counts[0]


def test_a_request_streams_its_tokens_and_ends_as_the_engine_alone_makes_them(model: CheckpointModel) -> None:
    expected = _engine(model).generate([PROMPT], [SamplingParams(max_tokens=6)])[0]
    steps: list[ExecutorStats] = []
    loop = EngineLoop(_engine(model), on_step=steps.append)
    try:
        handle = Recorder()
        loop.submit(Submission(handle, PROMPT, SamplingParams(max_tokens=6)))
        handle.wait()
    finally:
        loop.shutdown("done")
    assert handle.failures == []
    assert handle.progress_ids[-1] == expected and handle.finish_reasons[-1] == "length"
    assert [len(ids) for ids in handle.progress_ids] == [1, 2, 3, 4, 5, 6]  # one token per step
    assert len(steps) >= 6 and steps[-1].iteration_counter == len(steps)


def test_a_client_that_leaves_mid_stream_fails_as_cancelled_and_frees_its_sequence(model: CheckpointModel) -> None:
    loop = EngineLoop(_engine(model))
    try:
        handle = Recorder(cancel_after=2)
        loop.submit(Submission(handle, PROMPT, SamplingParams(max_tokens=200)))
        handle.wait()
        assert _running(loop) == 0
    finally:
        loop.shutdown("done")
    assert handle.failures == [("the request was cancelled", Failure.CANCELLED)]
    assert 2 <= len(handle.progress_ids) < 200


def test_an_owner_cancel_finishes_every_sequence_as_cancelled(model: CheckpointModel) -> None:
    loop = EngineLoop(_engine(model))
    try:
        handle = Recorder()
        release = _blocked(loop)
        loop.submit(Submission(handle, PROMPT, SamplingParams(max_tokens=200, n=2, temperature=1.0, top_k=5)))
        loop.cancel(handle)
        release.set()
        handle.wait()
        assert _running(loop) == 0
    finally:
        loop.shutdown("done")
    assert handle.failures == []
    assert handle.finish_reasons == ["cancelled", "cancelled"]  # both sequences, the second one last


def test_a_step_that_raises_fails_every_active_request_with_one_message(model: CheckpointModel) -> None:
    engine = _engine(model)

    def broken() -> tuple[list[Sequence], list[Sequence]]:
        raise RuntimeError("boom")

    engine.step = broken  # type: ignore[method-assign]
    loop = EngineLoop(engine)
    try:
        handles = [Recorder(), Recorder()]
        release = _blocked(loop)
        for handle in handles:
            loop.submit(Submission(handle, PROMPT, SamplingParams(max_tokens=4)))
        release.set()
        for handle in handles:
            handle.wait()
        assert _running(loop) == 0
    finally:
        loop.shutdown("done")
    assert [h.failures for h in handles] == [[("the CPU runtime failed: RuntimeError('boom')", Failure.INTERNAL)]] * 2


def test_shutdown_fails_active_queued_and_later_requests_with_its_reason(model: CheckpointModel) -> None:
    loop = EngineLoop(_engine(model))
    active = Recorder()
    loop.submit(Submission(active, PROMPT, SamplingParams(max_tokens=400)))
    while not active.progress_ids:  # it runs
        assert not active.ended.wait(0.01)
    release = _blocked(loop)
    queued = Recorder()
    loop.submit(Submission(queued, PROMPT, SamplingParams(max_tokens=4)))
    stopper = threading.Thread(target=loop.shutdown, args=("the server is shutting down",))
    stopper.start()
    release.set()
    stopper.join(WAIT_S)
    later = Recorder()
    loop.submit(Submission(later, PROMPT, SamplingParams(max_tokens=4)))
    unavailable = [("the server is shutting down", Failure.UNAVAILABLE)]
    assert [h.wait().failures for h in (active, queued, later)] == [unavailable] * 3


def test_a_full_queue_refuses_the_request_as_unavailable(model: CheckpointModel) -> None:
    loop = EngineLoop(_engine(model, max_batch_size=1, max_queue_size=1))
    try:
        handles = [Recorder(), Recorder(), Recorder()]
        release = _blocked(loop)  # all three arrive before a step: one runs, one waits, one finds the queue full
        for handle in handles:
            loop.submit(Submission(handle, PROMPT, SamplingParams(max_tokens=4)))
        release.set()
        for handle in handles:
            handle.wait()
    finally:
        loop.shutdown("done")
    assert [h.failures for h in handles[:2]] == [[], []]
    ((message, kind),) = handles[2].failures
    assert kind is Failure.UNAVAILABLE and message.startswith("the request queue is full")


def test_a_refused_request_fails_as_invalid_and_a_stop_request_id_cancels_its_own(model: CheckpointModel) -> None:
    loop = EngineLoop(_engine(model))
    try:
        refused, kept, stopped = Recorder(), Recorder(), Recorder()
        loop.submit(Submission(refused, [10**6], SamplingParams(max_tokens=4)))
        release = _blocked(loop)
        loop.submit(Submission(kept, PROMPT, SamplingParams(max_tokens=8), request_id="a"))
        loop.submit(Submission(stopped, PROMPT, SamplingParams(max_tokens=400), request_id="b"))
        loop.stop_request_id("b")
        release.set()
        for handle in (refused, kept, stopped):
            handle.wait()
    finally:
        loop.shutdown("done")
    assert refused.failures == [("input_ids hold a token outside the vocabulary [0, 1031).", Failure.INVALID)]
    assert kept.failures == [] and kept.finish_reasons[-1] == "length"
    assert stopped.failures == [("the request was stopped", Failure.CANCELLED)]
