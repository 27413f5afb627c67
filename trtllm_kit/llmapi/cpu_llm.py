"""An ``LLM``-compatible class over the kit's CPU runtime, so the Triton ``llmapi`` model file runs unchanged on
a machine without a GPU: ``LLM(model=..., **TorchLlmArgs)``, ``generate_async(prompt or token ids,
SamplingParams, streaming, priority)`` returning an async-iterable result with ``abort()`` and ``aresult()``,
``get_stats()`` (iteration statistics under the C++ executor's JSON keys) and ``shutdown()``. ``SamplingParams``
carries ``n``/``best_of``, logprobs, the penalties and ``guided_decoding`` (``cpu_types.py``); guided decoding
needs ``guided_decoding_backend: xgrammar``, as it does on the GPU. A request's ``LoRARequest`` runs it with that
PEFT adapter (``cpu_lora.py``; needs ``lora_config``), different adapters and none in one batch.

The engine steps in the engine loop's thread (``runtime/loop.py``); each request's outputs reach its asyncio loop
through ``call_soon_threadsafe`` (``cpu_result.ResultHandle``). The checkpoint is loaded as the PyTorch backend
loads it (``load_unified``) at the model's ``tensor_parallel_size``/``pipeline_parallel_size``; a cpu artifact's
TensorRT-LLM checkpoint is read as it was sharded (``load_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from trtllm_kit.defaults import DEFAULT_MAX_LORAS
from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.cpu_disagg import Disaggregation
from trtllm_kit.llmapi.cpu_lora import CpuLoraManager
from trtllm_kit.llmapi.cpu_result import RequestError, RequestOutput, ResultHandle
from trtllm_kit.llmapi.cpu_speculation import speculator_of
from trtllm_kit.llmapi.cpu_types import GuidedDecodingParams, LoRARequest, SamplingParams
from trtllm_kit.llmapi.disaggregated_params import DisaggregatedParams
from trtllm_kit.llmapi.load import load_checkpoint
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.hf_tokenizer import HFTokenizer
from trtllm_kit.runtime.block_manager import KvEvent
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.draft_counts import DraftCounts, iteration_stats
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.grammar import CompiledGuide, Guide, tokenizer_info
from trtllm_kit.runtime.guide_service import GuideService
from trtllm_kit.runtime.handle import failure_of
from trtllm_kit.runtime.loop import EngineLoop, Submission
from trtllm_kit.runtime.request import sampling_params as runtime_settings
from trtllm_kit.runtime.sequence import DEFAULT_PRIORITY
from trtllm_kit.runtime.sequence import SamplingParams as RuntimeParams
from trtllm_kit.runtime.stats import ExecutorStats, executor_stats
from trtllm_kit.runtime.threads import on_passing_thread
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.request import NEVER_END_ID, sampled_settings

# the fields the LLM API's SamplingParams and the wire's request both declare, by name (the end id: the model's default)
SHARED_FIELDS = tuple(sorted({f.name for f in fields(SamplingParams)} & {f.name for f in fields(GenerationRequest)}
                             - {"end_id"}))
U64 = (1 << 64) - 1  # KV cache event hashes are unsigned 64-bit, as TensorRT-LLM's and Dynamo's
__all__ = ["LLM", "DisaggregatedParams", "GuidedDecodingParams", "LoRARequest", "RequestError", "RequestOutput",
           "SamplingParams"]


class LLM:
    """The kit's CPU runtime behind ``tensorrt_llm.LLM``'s constructor and methods.

    Arguments:
        model: the unified checkpoint directory (or a cpu artifact's TensorRT-LLM checkpoint);
        tensor_parallel_size, pipeline_parallel_size: the layout the
        runtime emulates; max_batch_size, max_num_tokens, max_seq_len, kv_cache_config, enable_chunked_prefill,
        scheduler_config, guided_decoding_backend (None or ``xgrammar``), lora_config (``max_loras``,
        ``max_cpu_loras``, ``max_lora_rank``, ``lora_target_modules``): as ``TorchLlmArgs``;
        cache_transceiver_config: its ``kv_transfer_timeout_ms`` bounds how long a context-only request's blocks
        wait for their fetch (``cpu_disagg.py``); speculative_config: ``NGram`` or ``DraftTarget`` speculation
        (``cpu_speculation.py``); every other ``TorchLlmArgs`` field is accepted and has no effect.
    """

    def __init__(self, model: str, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 max_batch_size: int | None = None, max_num_tokens: int | None = None, max_seq_len: int | None = None,
                 kv_cache_config: dict[str, Any] | None = None, enable_chunked_prefill: bool = False,
                 scheduler_config: dict[str, Any] | None = None, guided_decoding_backend: str | None = None,
                 lora_config: dict[str, Any] | None = None, cache_transceiver_config: dict[str, Any] | None = None,
                 speculative_config: dict[str, Any] | None = None, **_gpu_only: Any) -> None:
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
                                   enable_chunked_context=bool(enable_chunked_prefill), max_seq_len=seq_len,
                                   lora_cache_max_adapters=int((lora_config or {}).get("max_loras")
                                                               or DEFAULT_MAX_LORAS))
        path = Path(model)
        mapping = Mapping(int(tensor_parallel_size), int(pipeline_parallel_size))

        def engine() -> Executor:
            target = load_checkpoint(path, mapping)
            return Executor(target, self.config, speculator_of(speculative_config, self.config,
                                                               target.dims.vocab_size))

        self.engine = on_passing_thread(engine)  # the engine thread's OpenMP pool is then the process's only one
        if int(kv.get("event_buffer_max_size") or 0) > 0:  # as TensorRT-LLM: KV cache events only when buffered
            self.engine.scheduler.block_manager.record_events(int(kv["event_buffer_max_size"]))
        self.lora = None if lora_config is None else \
            CpuLoraManager(lora_config, self.engine.model.config, self.engine.model.dtype)
        self.tokenizer = _tokenizer(path)
        self.eos_token_id = self.tokenizer.token_id("eos_token") if self.tokenizer else None
        if guided_decoding_backend not in (None, "xgrammar"):
            raise ValueError(f"guided_decoding_backend {guided_decoding_backend!r} is not available on the CPU "
                             "runtime; use xgrammar")
        self.guided_decoding_backend = guided_decoding_backend
        self._guides: GuideService | None = None  # made on the first guided request
        self._stats: list[dict[str, Any]] = []
        self._num_kv_events = 0
        self._draft_counts = DraftCounts()  # the speculator's counts at the last recorded step
        self.disagg = Disaggregation(self.engine, cache_transceiver_config)
        self.loop = self.disagg.loop = EngineLoop(
            self.engine, idle_timeout=lambda _: self.disagg.transceiver.wait_s(), on_turn=self.disagg.expire,
            on_step=self._record, name="trtllm-kit-cpu-llm")

    def generate_async(self, inputs: str | list[int], sampling_params: SamplingParams | None = None,
                       lora_request: LoRARequest | None = None, streaming: bool = False,
                       priority: float = DEFAULT_PRIORITY, disaggregated_params: DisaggregatedParams | None = None,
                       **_unused: Any) -> RequestOutput:
        """Queue one request (a prompt string or token ids); must be called on the asyncio loop that consumes it.

        Arguments:
            inputs: the prompt; sampling_params: generation settings; lora_request: the adapter to run with (None:
            the base model; needs ``lora_config``); streaming: one output per step;
            priority: TensorRT-LLM's request priority in [0, 1], higher first (the CPU runtime's scheduler orders
            its waiting queue by it and preempts lower-priority running requests for it);
            disaggregated_params: a context-only or generation-only request (``cpu_disagg.py``).
        """
        params = sampling_params or SamplingParams()
        ids = list(inputs) if isinstance(inputs, list) else self._encode(str(inputs), add_special_tokens=True)
        runtime_params = self._runtime_params(ids, params, float(priority))  # refuses bad values before anything runs
        guide = self._guide(params.guided_decoding)
        lora = None
        if lora_request is not None:
            if self.lora is None:
                raise ValueError("a LoRA request needs lora_config in the LLM arguments (model.yaml); rebuild the "
                                 "artifact with --lora NAME=DIR or --lora-target-modules")
            lora = self.lora.resolve(lora_request)
        output = RequestOutput(self, ids, streaming, params)
        if disaggregated_params is not None and lora is not None:
            raise ValueError("the CPU runtime does not run a LoRA adapter in a disaggregated request; send "
                             "lora_request or disaggregated_params, not both")
        handle = ResultHandle(output, self.disagg.finished)

        def submit(ready: RuntimeParams) -> None:
            if disaggregated_params is not None:
                self.disagg.submit(Submission(handle, ids, ready), disaggregated_params)
            else:
                self.loop.submit(Submission(handle, ids, ready, lora=lora))

        self._when_compiled(guide, handle, runtime_params, submit)
        return output

    def get_stats(self, timeout: float = 2) -> list[dict[str, Any]]:
        """Iteration statistics since the last call (the C++ executor's keys), newest last.

        Arguments:
            timeout: accepted for compatibility; never waits.
        """
        stats, self._stats = self._stats, []
        return stats or [self._snapshot(self.engine.stats())]

    def get_kv_cache_events(self, timeout: float = 2) -> list[dict[str, Any]]:
        """KV cache events since the last call, oldest first, in the LLM API's dict form: ``stored`` blocks with
        their hash and tokens under their parent's hash, ``removed`` block hashes (unsigned 64-bit); empty unless
        ``kv_cache_config.event_buffer_max_size`` > 0.

        Arguments:
            timeout: accepted for compatibility; never waits.
        """
        events = self.engine.scheduler.block_manager.events
        taken: list[KvEvent] = []
        while events:
            taken.append(events.popleft())  # the engine thread appends meanwhile; a deque takes both safely
        self._num_kv_events += len(taken)
        return [_event_dict(self._num_kv_events - len(taken) + i, e) for i, e in enumerate(taken)]

    def shutdown(self) -> None:
        """Stop the engine thread; requests still running are finished as cancelled."""
        self.loop.shutdown("the LLM was shut down", cancel_active=True)
        self.disagg.transceiver.close()
        if self._guides is not None:
            self._guides.close()

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self.tokenizer is None:
            raise KitUsageError("the checkpoint has no tokenizer files; send token ids (input_ids) instead of text.")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _runtime_params(self, ids: list[int], p: SamplingParams, priority: float = DEFAULT_PRIORITY) -> RuntimeParams:
        """The runtime's settings of ``p``: the fields it shares with the wire's request by name, in the wire's
        terms (``sampled_settings``) and checked by its rules; the LLM API's own meanings beside them (``ignore_eos``
        is no end token, ``stop`` strings end as their token ids)."""
        stops = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        req = GenerationRequest(
            tuple(ids), **sampled_settings({name: getattr(p, name) for name in SHARED_FIELDS}), priority=priority,
            end_id=NEVER_END_ID if p.ignore_eos else (p.end_id if p.end_id is not None else self.eos_token_id),
            stop_words=tuple(tuple(self._encode(s, add_special_tokens=False)) for s in stops if s))
        return runtime_settings(req)

    def _guide(self, params: GuidedDecodingParams | None) -> Future[CompiledGuide] | None:
        """The request's guide, compiling in the guide service's process (None without one); needs
        ``guided_decoding_backend: xgrammar``."""
        guide = params.guide() if params is not None else None
        if guide is None:
            return None
        if self.guided_decoding_backend != "xgrammar":
            raise ValueError("guided decoding needs guided_decoding_backend: xgrammar in the LLM arguments "
                             "(model.yaml)")
        if self.tokenizer is None:
            raise ValueError("guided decoding needs the checkpoint's tokenizer files")
        if self._guides is None:
            directory, vocab_size = self.tokenizer.directory, self.engine.model.dims.vocab_size
            stops = [self.eos_token_id] if self.eos_token_id is not None else []
            self._guides = GuideService(lambda: tokenizer_info(_transformers_tokenizer(directory), vocab_size, stops))
        return self._guides.compile(Guide(*guide))

    def _when_compiled(self, guide: Future[CompiledGuide] | None, handle: ResultHandle, params: RuntimeParams,
                       submit: Callable[[RuntimeParams], None]) -> None:
        """``submit(params)`` now without a guide; with one, once it has compiled (off the caller's loop), with the
        compiled guide in ``params``. A refused guide finishes the request with the refusal."""
        if guide is None:
            submit(params)
            return

        def compiled(done: Future[CompiledGuide]) -> None:
            try:
                submit(replace(params, guide=done.result()))
            except Exception as exc:  # the request is answered whatever its guide or its submission raised
                handle.failed(str(exc), failure_of(exc))

        guide.add_done_callback(compiled)

    def _cancel(self, output: RequestOutput) -> None:
        if output.handle is not None:
            self.loop.cancel(output.handle)

    def _record(self, stats: ExecutorStats) -> None:
        """Keep the step's statistics for ``get_stats`` (engine thread; the last 100)."""
        snapshot, speculator = self._snapshot(stats), self.engine.speculator
        if speculator is not None:  # the step's drafts under the executor's specDecodingStats keys
            snapshot["specDecodingStats"] = iteration_stats(speculator.counts, self._draft_counts)
            self._draft_counts = replace(speculator.counts,
                                         accepted_per_position=list(speculator.counts.accepted_per_position))
        self._stats.append(snapshot)
        del self._stats[:-100]

    def _snapshot(self, stats: ExecutorStats) -> dict[str, Any]:
        return {**executor_stats(stats), "kvTransferStats": self.disagg.stats()}


def _event_dict(event_id: int, event: KvEvent) -> dict[str, Any]:
    """One KV cache event as ``LLM.get_kv_cache_events`` gives it."""
    if event.kind == "removed":
        return {"event_id": event_id, "data": {"type": "removed", "block_hashes": [event.block_hash & U64]}}
    parent = None if event.parent_hash is None else event.parent_hash & U64
    block = {"type": "stored_block", "block_hash": event.block_hash & U64,
             "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in event.token_ids]}
    return {"event_id": event_id, "data": {"type": "stored", "parent_hash": parent, "blocks": [block]}}


def _tokenizer(path: Path) -> HFTokenizer | None:
    """The checkpoint's tokenizer, or None when it ships none (read without transformers where it has
    ``tokenizer.json``: a second less at every start)."""
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    return HFTokenizer(path)


def _transformers_tokenizer(path: Path) -> Any:
    """transformers' tokenizer of the checkpoint, which xgrammar reads its vocabulary from (the first guide's)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
