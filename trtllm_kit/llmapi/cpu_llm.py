"""An ``LLM``-compatible class over the kit's CPU runtime, so the Triton ``llmapi`` model file runs unchanged on
a machine without a GPU: ``LLM(model=..., **TorchLlmArgs)``, ``generate_async(prompt or token ids,
SamplingParams, streaming, priority)`` returning an async-iterable result with ``abort()`` and ``aresult()``,
``get_stats()`` (iteration statistics under the C++ executor's JSON keys) and ``shutdown()``.

The engine steps in its own thread; each request's outputs reach its asyncio loop through
``call_soon_threadsafe``. The checkpoint is loaded as the PyTorch backend loads it (``load_unified``) at the
model's ``tensor_parallel_size``/``pipeline_parallel_size``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import Mapping
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.runtime.engine import Engine, EngineConfig
from trtllm_kit.runtime.sequence import DEFAULT_PRIORITY, Sequence
from trtllm_kit.runtime.sequence import SamplingParams as RuntimeParams

ERROR = "error: "  # a finish reason that carries why the request could not run


class RequestError(RuntimeError):
    """A request the runtime refused (e.g. a prompt longer than max_seq_len, a token id outside the vocabulary)."""


FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "length": "length", "cancelled": "cancelled"}


@dataclass
class SamplingParams:
    """The ``tensorrt_llm.SamplingParams`` fields the llmapi model sets (``None``: the library default)."""

    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    min_tokens: int | None = None
    end_id: int | None = None
    ignore_eos: bool = False
    best_of: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    exclude_input_from_output: bool = True
    return_perf_metrics: bool = False


@dataclass
class CompletionOutput:
    """One generated sequence, as ``tensorrt_llm``'s ``CompletionOutput`` reports it."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    text_diff: str = ""
    token_ids_diff: list[int] = field(default_factory=list)


class RequestOutput:
    """The result of ``generate_async``: iterate it (``async for``) when streaming, await ``aresult()`` otherwise."""

    def __init__(self, llm: LLM, prompt_token_ids: list[int], streaming: bool) -> None:
        self.request_id = 0
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput()]
        self.finished = False
        self._llm, self._streaming = llm, streaming
        self._loop = asyncio.get_running_loop()
        self._updates: asyncio.Queue[tuple[list[int], str | None]] = asyncio.Queue()
        self.seq: Sequence | None = None

    def _push(self, token_ids: list[int], reason: str | None) -> None:  # engine thread → request loop
        self._loop.call_soon_threadsafe(self._updates.put_nowait, (token_ids, reason))

    def _apply(self, token_ids: list[int], reason: str | None) -> None:
        if reason is not None and reason.startswith(ERROR):  # raised where the caller awaits, as the LLM API does
            self.finished = True
            raise RequestError(reason.removeprefix(ERROR))
        out = self.outputs[0]
        before_text, before_ids = out.text, len(out.token_ids)
        out.token_ids = token_ids
        out.text = self._llm.tokenizer.decode(token_ids, skip_special_tokens=True) if self._llm.tokenizer else ""
        out.text_diff, out.token_ids_diff = out.text[len(before_text):], token_ids[before_ids:]
        if reason is not None:
            self.finished = True
            out.finish_reason = FINISH_REASONS.get(reason, reason)

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        self._apply(*await self._updates.get())
        return self

    async def aresult(self) -> RequestOutput:
        """Wait until the request finishes; returns the final output."""
        while not self.finished:
            self._apply(*await self._updates.get())
        return self

    def abort(self) -> None:
        """Cancel the request; its KV blocks are freed at the engine's next step."""
        self._llm._cancel(self)


class LLM:
    """The kit's CPU runtime behind ``tensorrt_llm.LLM``'s constructor and methods.

    Arguments:
        model: the unified checkpoint directory; tensor_parallel_size, pipeline_parallel_size: the layout the
        runtime emulates; max_batch_size, max_num_tokens, max_seq_len, kv_cache_config, enable_chunked_prefill,
        scheduler_config: as ``TorchLlmArgs``; every other ``TorchLlmArgs`` field is accepted and has no effect.
    """

    def __init__(self, model: str, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 max_batch_size: int | None = None, max_num_tokens: int | None = None, max_seq_len: int | None = None,
                 kv_cache_config: dict[str, Any] | None = None, enable_chunked_prefill: bool = False,
                 scheduler_config: dict[str, Any] | None = None, **_gpu_only: Any) -> None:
        kv = dict(kv_cache_config or {})
        policy = str((scheduler_config or {}).get("capacity_scheduler_policy", "GUARANTEED_NO_EVICT")).lower()
        batch, seq_len = int(max_batch_size or 8), int(max_seq_len or 1024)
        tokens_per_block = int(kv.get("tokens_per_block", 32))
        pool = int(kv.get("max_tokens") or batch * seq_len)
        self.config = EngineConfig(max_batch_size=batch, max_num_tokens=int(max_num_tokens or 2048),
                                   tokens_per_block=tokens_per_block,
                                   max_tokens_in_paged_kv_cache=max(pool, tokens_per_block),
                                   batch_scheduler_policy=policy,
                                   enable_kv_cache_reuse=bool(kv.get("enable_block_reuse", True)),
                                   enable_chunked_context=bool(enable_chunked_prefill), max_seq_len=seq_len)
        path = Path(model)
        self.engine = Engine(load_unified(path, Mapping(int(tensor_parallel_size), int(pipeline_parallel_size))),
                             self.config)
        self.tokenizer = _tokenizer(path)
        self.eos_token_id = self.tokenizer.eos_token_id if self.tokenizer else None
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._active: dict[int, tuple[RequestOutput, int]] = {}  # seq_id → (output, tokens sent)
        self._stats: list[dict[str, Any]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trtllm-kit-cpu-llm", daemon=True)
        self._thread.start()

    def generate_async(self, inputs: str | list[int], sampling_params: SamplingParams | None = None,
                       streaming: bool = False, priority: float = DEFAULT_PRIORITY, **_unused: Any) -> RequestOutput:
        """Queue one request (a prompt string or token ids); must be called on the asyncio loop that consumes it.

        Arguments:
            inputs: the prompt; sampling_params: generation settings; streaming: one output per step;
            priority: TensorRT-LLM's request priority in [0, 1], higher first (the CPU runtime's scheduler orders
            its waiting queue by it and preempts lower-priority running requests for it).
        """
        params = sampling_params or SamplingParams()
        ids = list(inputs) if isinstance(inputs, list) else self._encode(str(inputs), add_special_tokens=True)
        output = RequestOutput(self, ids, streaming)
        self._inbox.put(("add", (output, self._runtime_params(params, float(priority)))))
        return output

    def get_stats(self, timeout: float = 2) -> list[dict[str, Any]]:
        """Iteration statistics since the last call (the C++ executor's keys), newest last.

        Arguments:
            timeout: accepted for compatibility; never waits.
        """
        stats, self._stats = self._stats, []
        return stats or [self._snapshot()]

    def shutdown(self) -> None:
        """Stop the engine thread; requests still running are finished as cancelled."""
        self._stopping.set()
        self._inbox.put(("stop", None))
        self._thread.join(timeout=30)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self.tokenizer is None:
            raise KitUsageError("the checkpoint has no tokenizer files; send token ids (input_ids) instead of text.")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _runtime_params(self, p: SamplingParams, priority: float = DEFAULT_PRIORITY) -> RuntimeParams:
        stops = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        sampled = p.temperature not in (None, 0.0) and p.top_k is None and p.top_p is None
        return RuntimeParams(
            max_tokens=int(p.max_tokens), min_tokens=int(p.min_tokens or 0),
            end_id=None if p.ignore_eos else (p.end_id if p.end_id is not None else self.eos_token_id),
            temperature=1.0 if p.temperature is None else float(p.temperature), top_k=int(p.top_k or 0),
            top_p=1.0 if sampled else float(p.top_p or 0.0), seed=int(p.seed or 0),
            stop_words=[self._encode(s, add_special_tokens=False) for s in stops if s], priority=priority)

    def _cancel(self, output: RequestOutput) -> None:
        self._inbox.put(("cancel", output))

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                timeout = 0 if self.engine.has_work() else None
                self._handle(*(self._inbox.get_nowait() if timeout == 0 else self._inbox.get()))
                while True:
                    self._handle(*self._inbox.get_nowait())
            except queue.Empty:
                pass
            if self.engine.has_work():
                try:
                    sampled, finished = self.engine.step()
                except Exception as exc:  # a failing step must not wedge the loop: its requests end with the error
                    for output, _ in list(self._active.values()):
                        if output.seq is not None:
                            self.engine.cancel(output.seq)
                            del self._active[output.seq.seq_id]
                            output._push([], f"{ERROR}the CPU runtime failed: {exc!r}")
                    continue
                for seq in {s.seq_id: s for s in [*sampled, *finished]}.values():
                    self._progress(seq)
                self._stats.append(self._snapshot())
                del self._stats[:-100]
        for output, _ in list(self._active.values()):
            if output.seq is not None:
                self.engine.cancel(output.seq)
                self._progress(output.seq)

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "add":
            output, params = payload
            try:
                output.seq = self.engine.add_request(output.prompt_token_ids, params)
            except Exception as exc:  # a request that can never run finishes at once with the reason
                output._push([], f"{ERROR}{exc}")
                return
            self._active[output.seq.seq_id] = (output, 0)
        elif kind == "cancel" and payload.seq is not None and payload.seq.seq_id in self._active:
            self.engine.cancel(payload.seq)
            self._progress(payload.seq)

    def _progress(self, seq: Sequence) -> None:
        output, sent = self._active.get(seq.seq_id, (None, 0))
        if output is None:
            return
        ids = list(seq.output_ids)
        if seq.is_finished:
            del self._active[seq.seq_id]
            reason = f"{ERROR}{seq.error}" if seq.finish_reason == "error" else seq.finish_reason or "length"
            output._push(ids, reason)
        elif len(ids) > sent and output._streaming:
            self._active[seq.seq_id] = (output, len(ids))
            output._push(ids, None)

    def _snapshot(self) -> dict[str, Any]:
        s = self.engine.stats()
        return {"iter": s.iteration_counter, "numActiveRequests": s.active, "maxNumActiveRequests": s.max,
                "numQueuedRequests": s.waiting,
                "kvCacheStats": {"maxNumBlocks": s.blocks_max, "freeNumBlocks": s.blocks_free,
                                 "usedNumBlocks": s.blocks_used, "tokensPerBlock": s.tokens_per_block,
                                 "reusedBlocks": s.blocks_reused, "missedBlocks": s.blocks_missed},
                "inflightBatchingStats": {"numScheduledRequests": s.scheduled, "numContextRequests": s.context,
                                          "numGenRequests": s.generation_requests,
                                          "numPausedRequests": s.preemptions, "numCtxTokens": s.total_context_tokens}}


def _tokenizer(path: Path) -> Any:
    """The checkpoint's tokenizer (transformers), or None when it ships none."""
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
