"""Guides compiled away from the engine loop: ``GuideService.compile`` returns a future at once and the compile runs
in a worker process (``guide_worker.py``) with its time, memory and concurrency bounded (``guide_limits.py``), so a
slow guide delays only the request that sent it. Results are kept by guide, refusals too (a malformed guide, or one
that needs too much memory, is refused again at once); a guide asked for while it compiles shares its compile; a
guide that ran out of time is compiled again when asked again, as the time depends on the machine's load.

The worker starts on the first compile, in the service's thread: xgrammar's tokenizer information is built there
(seconds for a large vocabulary) and handed to it. If it dies, the guides it was compiling fail with the reason and
the next compile starts a new one.
"""

from __future__ import annotations

import itertools
import os
import queue
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from trtllm_kit.errors import KitError
from trtllm_kit.runtime.grammar import CompiledGuide, Guide
from trtllm_kit.runtime.guide_limits import (
    GUIDE_CACHE_BYTES,
    GUIDE_CACHE_ENTRIES,
    GuideRefused,
    guide_field,
    guide_problem,
)
from trtllm_kit.runtime.guide_worker import encode_frame, read_frame

TIMED_OUT = "did not compile within"  # a refusal that depends on the load: not kept


class GuideService:
    """Compiles guides for one tokenizer in a worker process and keeps the results.

    Arguments:
        make_info: builds xgrammar's ``TokenizerInfo`` for the model (called once, in the service's thread).
    """

    def __init__(self, make_info: Callable[[], Any]) -> None:
        self._make_info = make_info
        self._info: Any = None
        self._lock = threading.Lock()
        self._kept: OrderedDict[Guide, Future[CompiledGuide]] = OrderedDict()  # oldest first
        self._sent: dict[int, tuple[Guide, Future[CompiledGuide]]] = {}  # request id → a guide not yet settled
        self._holder: dict[int, subprocess.Popen[bytes]] = {}  # request id → the worker it was handed to
        self._outbox: queue.Queue[tuple[int, Guide] | None] = queue.Queue()
        self._ids = itertools.count()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def compile(self, guide: Guide) -> Future[CompiledGuide]:
        """The compiled guide, as a future: done at once when the guide is kept or past a size bound, else when the
        worker answers; it raises ``GuideRefused`` for the client's mistakes and ``KitError`` for the server's.

        Arguments:
            guide: what the output must match.
        """
        with self._lock:
            kept = self._kept.get(guide)
            if kept is not None:
                self._kept.move_to_end(guide)
                return _fresh(kept)
        future: Future[CompiledGuide] = Future()
        problem = guide_problem(guide_field(guide.guide_type), guide.guide_type, guide.guide)
        if problem is not None:
            future.set_exception(GuideRefused(problem))
            return future
        with self._lock:
            if guide in self._kept:  # sent by another thread meanwhile
                return _fresh(self._kept[guide])
            if self._closed:
                future.set_exception(KitError("the guide compiler is stopped: the model is shutting down."))
                return future
            self._kept[guide] = future
            request_id = next(self._ids)
            self._sent[request_id] = (guide, future)
            self._evict()
            if self._thread is None:
                self._thread = threading.Thread(target=self._send, name="trtllm-kit-guides", daemon=True)
                self._thread.start()
        self._outbox.put((request_id, guide))
        return future

    def close(self) -> None:
        """Stop the worker (its compiles are killed) and fail the guides still compiling."""
        with self._lock:
            self._closed = True
        self._outbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._stop_worker()

    def _send(self) -> None:
        """The service's thread: start the worker when needed and hand it each guide."""
        while (item := self._outbox.get()) is not None:
            request_id, guide = item
            try:
                process = self._worker()
                with self._lock:
                    self._holder[request_id] = process
                assert process.stdin is not None
                process.stdin.write(encode_frame({"id": request_id, "guide_type": guide.guide_type,
                                                  "guide": guide.guide}))
                process.stdin.flush()
            except Exception as exc:  # the thread must live on: this guide fails, the next one tries again
                self._resolve(request_id, KitError(f"the guide compiler could not take the guide ({exc})."))

    def _worker(self) -> subprocess.Popen[bytes]:
        """The running worker; starts one (and the thread that reads its answers) when there is none."""
        if self._process is not None and self._process.poll() is None:
            return self._process
        if self._info is None:
            self._info = self._make_info()
        process = subprocess.Popen([sys.executable, "-m", "trtllm_kit.runtime.guide_worker", str(os.getpid())],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdin is not None
        process.stdin.write(encode_frame({"tokenizer_info": self._info.serialize_json()}))
        self._process = process
        threading.Thread(target=self._read, args=(process,), name="trtllm-kit-guide-answers", daemon=True).start()
        return process

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        """Resolve each guide the worker answers; when it ends, fail the guides it held."""
        assert process.stdout is not None
        try:
            while (answer := read_frame(process.stdout)) is not None:
                self._answer(answer)
        except (OSError, ValueError, KeyError):  # a broken answer: this worker is not trusted further
            process.kill()
        code = process.wait()
        with self._lock:
            held = [request_id for request_id, holder in self._holder.items() if holder is process]
        for request_id in held:
            self._resolve(request_id, KitError(f"the guide compiler process ended (exit code {code})."))

    def _answer(self, answer: dict[str, Any]) -> None:
        request_id = int(answer["id"])
        if "compiled" in answer:
            try:
                self._resolve(request_id, CompiledGuide.from_json(answer["compiled"], self._info))
            except Exception as exc:  # a compiled guide that cannot be read back fails its request alone
                self._resolve(request_id, KitError(f"the compiled guide could not be read ({exc!r})."))
        elif "refused" in answer:
            self._resolve(request_id, GuideRefused(answer["refused"]))
        else:
            self._resolve(request_id, KitError(f"{answer.get('failed', 'the guide did not compile')}."))

    def _resolve(self, request_id: int, outcome: CompiledGuide | KitError) -> None:
        """Settle a sent guide; failures of the server, and time-outs, are not kept."""
        with self._lock:
            guide, future = self._sent.pop(request_id, (None, None))
            self._holder.pop(request_id, None)
            if guide is None or future is None:
                return
            if isinstance(outcome, KitError) and (not isinstance(outcome, GuideRefused) or TIMED_OUT in str(outcome)):
                self._kept.pop(guide, None)
        if isinstance(outcome, KitError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        with self._lock:
            self._evict()

    def _evict(self) -> None:
        """Forget the oldest settled guides past ``GUIDE_CACHE_ENTRIES`` or ``GUIDE_CACHE_BYTES`` (with the lock)."""
        settled = [(guide, f) for guide, f in self._kept.items() if f.done()]
        total = sum(f.result().memory_bytes for _, f in settled if f.exception() is None)
        for guide, future in settled:
            if len(self._kept) <= GUIDE_CACHE_ENTRIES and total <= GUIDE_CACHE_BYTES:
                break
            del self._kept[guide]
            total -= future.result().memory_bytes if future.exception() is None else 0

    def _stop_worker(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # the worker kills its compiles and exits
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _fresh(kept: Future[CompiledGuide]) -> Future[CompiledGuide]:
    """``kept``, or for a refusal a future of its own (an exception raised again and again grows its traceback)."""
    if not kept.done() or kept.exception() is None:
        return kept
    future: Future[CompiledGuide] = Future()
    future.set_exception(GuideRefused(str(kept.exception())))
    return future
