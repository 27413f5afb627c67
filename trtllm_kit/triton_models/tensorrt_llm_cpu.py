"""The ``tensorrt_llm`` model on CPU: a Triton Python-backend model running the kit's in-flight batching runtime.

It takes the upstream tensors (``input_ids``, ``input_lengths``, ``request_output_len``, ``end_id``,
``pad_id``, ``streaming``, the sampling inputs) and answers with ``output_ids`` and ``sequence_length``
(plus the optional counters), so clients and the ensemble cannot tell it from the GPU backend. The engine
runs in its own thread; ``execute`` only hands requests over. In decoupled mode every step's new tokens are
streamed; cancelled requests are dropped (blocks freed) at the next step, and so are those named by a request
with ``stop = true`` and the same request id (how the TensorRT-LLM backend stops a request, and how
``tensorrt_llm_bls`` stops its inner call when its client leaves). Configuration comes from the
model's ``parameters``: ``gpt_model_path`` (the TensorRT-LLM checkpoint), ``max_batch_size``,
``max_num_tokens``, ``max_seq_len``, ``tokens_per_block``, ``max_tokens_in_paged_kv_cache``,
``batch_scheduler_policy``, ``enable_kv_cache_reuse``, ``enable_chunked_context``,
``exclude_input_in_output``, ``cpu_threads`` (torch threads), ``xgrammar_tokenizer_info_path`` (guided decoding;
relative paths resolve in the model directory); ``max_queue_size`` also from
``dynamic_batching.default_queue_policy``.

Beyond the basic tensors (docs/openai-eval-engine.md): the penalties, ``min_tokens``, ``runtime_min_p``;
``num_return_sequences`` (decoupled mode: one response stream per sequence, each response carrying its
``sequence_index``); ``return_log_probs`` → ``output_log_probs`` and ``cum_log_probs`` (raw logprobs), with
``num_top_log_probs`` → ``top_log_probs`` / ``top_log_prob_ids``; ``return_prompt_log_probs`` →
``prompt_log_probs`` / ``prompt_top_log_probs`` / ``prompt_top_log_prob_ids`` (in each sequence's first response);
``return_context_logits`` / ``return_generation_logits``; ``guided_decoding_guide_type`` / ``guided_decoding_guide``
(compiled in a process of its own, ``runtime/guide_service.py``: the request waits aside, the loop goes on);
``keep_end_token`` (the token that ends the sequence is the last of ``output_ids``, with its logprob).

Requests and responses go through the wire's ``tensorrt_llm`` codec (``trtllm_kit.wire.trtllm``,
``trtllm_response``): a value out of its field's rule is refused naming its tensor; the runtime's settings come from
``runtime/request.py``, the response's tensors from ``runtime/response.py``.
"""

from __future__ import annotations

import json
import queue
import threading
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.engine import Engine
from trtllm_kit.runtime.grammar import CompiledGuide, Guide, tokenizer_info_file
from trtllm_kit.runtime.guide_service import GuideService
from trtllm_kit.runtime.handle import QueueFullError
from trtllm_kit.runtime.heartbeat import Heartbeat
from trtllm_kit.runtime.lora import LoraRequest, cache_capacity, from_rows
from trtllm_kit.runtime.request import sampling_params
from trtllm_kit.runtime.response import perf_of, response_of
from trtllm_kit.runtime.sequence import Sequence
from trtllm_kit.wire import GenerationRequest, LoraAdapter
from trtllm_kit.wire.tensor import is_stop_request
from trtllm_kit.wire.trtllm import decode_trtllm_request, request_tensors
from trtllm_kit.wire.trtllm_response import encode_trtllm_response

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUTS = tuple(t.name for t in request_tensors())  # every input the wire reads
METRICS = {  # family → (label name, EngineStats field per label value)
    "nv_trt_llm_request_metrics": ("request_type", {"active": "active", "max": "max", "scheduled": "scheduled",
                                                    "context": "context", "waiting": "waiting"}),
    "nv_trt_llm_kv_cache_block_metrics": ("kv_cache_block_type", {
        "max": "blocks_max", "free": "blocks_free", "used": "blocks_used", "tokens_per": "tokens_per_block",
        "reused": "blocks_reused", "missed": "blocks_missed", "fraction": "blocks_fraction"}),
    "nv_trt_llm_inflight_batcher_metrics": ("inflight_batcher_specific_metric", {
        "total_context_tokens": "total_context_tokens", "generation_requests": "generation_requests",
        "paused_requests": "preemptions"}),
    "nv_trt_llm_general_metrics": ("general_type", {"iteration_counter": "iteration_counter",
                                                    "timestamp": "timestamp"}),
    "trtllm_kit_batch_metrics": ("batch_metric", {"total_scheduled_requests": "total_scheduled_requests",
                                                  "peak_scheduled": "peak_scheduled", "step_tokens": "step_tokens"}),
}


def _arrays(request) -> dict[str, np.ndarray]:
    """The request's inputs as numpy arrays; ``lora_weights`` through dlpack (numpy has no bfloat16: BF16 rows come
    as their bit patterns in a ``uint16`` array)."""
    arrays = {}
    for name in INPUTS:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            continue
        if name == "lora_weights":
            rows = torch.from_dlpack(tensor.to_dlpack())
            is_bf16 = rows.dtype == torch.bfloat16
            arrays[name] = rows.view(torch.int16).numpy().view(np.uint16) if is_bf16 else rows.numpy()
        else:
            arrays[name] = tensor.as_numpy()
    return arrays


class _Pending:
    """A Triton request and what the engine thread knows about it."""

    def __init__(self, request, sender=None) -> None:
        self.request, self.sender = request, sender
        self.seq: Sequence | None = None
        self.wire: GenerationRequest | None = None  # the request as decoded, once
        self.streaming = self.exclude_input = False
        self.num_sent: dict[int, int] = {}  # sequence index → output tokens sent
        self.guide: Future[CompiledGuide] | None = None  # its guide, compiling or compiled
        self.response = None
        self.done = threading.Event()

    @property
    def admitted(self) -> Sequence:
        """The engine's sequence: set when the request is admitted (only admitted requests are active)."""
        assert self.seq is not None, "the request was admitted"
        return self.seq


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        parameters.setdefault("max_batch_size", str(config.get("max_batch_size") or ""))
        queue_policy = config.get("dynamic_batching", {}).get("default_queue_policy", {})
        parameters.setdefault("max_queue_size", str(queue_policy.get("max_queue_size", "")))
        if not parameters.get("gpt_model_path"):
            raise KitUsageError("the tensorrt_llm model has no gpt_model_path parameter; set it to the "
                                "TensorRT-LLM checkpoint directory.")
        ckpt = Path(args["model_repository"]) / parameters["gpt_model_path"]  # absolute paths stay absolute
        torch.set_num_threads(int(parameters.get("cpu_threads") or torch.get_num_threads()))
        host_bytes = parameters.get("lora_cache_host_memory_bytes")
        max_rank = parameters.get("lora_cache_max_adapter_size")
        if host_bytes and max_rank and not parameters.get("lora_cache_max_adapters"):  # the backend's cache in adapters
            checkpoint = json.loads((ckpt / "config.json").read_text())
            parameters["lora_cache_max_adapters"] = str(cache_capacity(checkpoint, int(max_rank), int(host_bytes)))
        self.engine = Engine.from_checkpoint(ckpt, EngineConfig.from_parameters(parameters))
        info = parameters.get("xgrammar_tokenizer_info_path", "")
        info_path, vocab_size = Path(args["model_repository"]) / info, self.engine.model.dims.vocab_size
        self.guides = GuideService(lambda: tokenizer_info_file(info_path, vocab_size)) \
            if info and "${" not in info else None
        self.parked: set[_Pending] = set()  # requests whose guide compiles
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled"))
        self.exclude_input = parameters.get("exclude_input_in_output", "false").lower() == "true"
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.metrics, self.families = {}, []  # a family must outlive its metrics
        for family, (label, values) in METRICS.items():
            self.families.append(pb_utils.MetricFamily(name=family, description=f"CPU runtime {label}",
                                                       kind=pb_utils.MetricFamily.GAUGE))
            self.metrics.update({field: self.families[-1].Metric(labels={**labels, label: value})
                                 for value, field in values.items()})
        self.inbox: queue.Queue[_Pending | None] = queue.Queue()  # None wakes the loop to stop
        self.active: dict[int, _Pending] = {}
        self.stopping = threading.Event()
        self.heartbeat = Heartbeat()  # serve's watchdog: a loop that stops turning while it holds requests is hung
        self.heartbeat.beat(0)
        self.thread = threading.Thread(target=self._loop, name="trtllm-kit-engine", daemon=True)
        self.thread.start()

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                self.inbox.put(_Pending(request, request.get_response_sender()))
            return None
        pending = [_Pending(request) for request in requests]
        for item in pending:
            self.inbox.put(item)
        for item in pending:
            item.done.wait()
        return [item.response for item in pending]

    def finalize(self) -> None:
        self.stopping.set()
        self.inbox.put(None)
        self.thread.join(timeout=30)
        if self.guides is not None:
            self.guides.close()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                # idle: sleep until a request arrives (polling only while requests wait, for cancellations)
                timeout = 0 if self.engine.has_work() else 0.05 if self.active else None
                self._admit(self.inbox.get(timeout=timeout) if timeout != 0 else self.inbox.get_nowait())
                while True:
                    self._admit(self.inbox.get_nowait())
            except queue.Empty:
                pass
            for item in {id(p): p for p in self.active.values() if p.request.is_cancelled()}.values():
                self._cancel(item)
                self._finish(item, pb_utils.TritonError("the request was cancelled", pb_utils.TritonError.CANCELLED))
            if self.engine.has_work():
                try:
                    sampled, _ = self.engine.step()
                except Exception as exc:  # a failing step must not leave clients waiting forever
                    pb_utils.Logger.log_error(f"CPU runtime step failed: {exc!r}")
                    for item in {id(p): p for p in self.active.values()}.values():
                        self._cancel(item)
                        self._finish(item, pb_utils.TritonError(f"the CPU runtime failed: {exc!r}"))
                    continue
                for seq in sampled:
                    if seq.seq_id in self.active:
                        self._progress(self.active[seq.seq_id], seq)
            self._publish()
            self.heartbeat.beat(len(self.active) + self.inbox.qsize())
        for item in [*{id(p): p for p in self.active.values()}.values(), *self.parked]:
            self._finish(item, pb_utils.TritonError("the server is shutting down", pb_utils.TritonError.UNAVAILABLE))

    def _admit(self, item: _Pending | None) -> None:
        """Turn a Triton request into a sequence; a bad or unqueueable request is answered with its error."""
        if item is None:
            return
        try:
            if item.wire is None:
                arrays = _arrays(item.request)
                if is_stop_request(arrays):
                    self._stop(item)
                    return
                item.wire = decode_trtllm_request(arrays)
            if self._compiling(item):
                return
            req = item.wire
            if (req.n or 1) > 1 and not self.decoupled:
                raise KitUsageError("num_return_sequences > 1 needs the model's decoupled transaction policy (one "
                                    "response per sequence); send 1 or regenerate the repository with decoupled mode.")
            params = sampling_params(req, guide=None if item.guide is None else item.guide.result())
            item.streaming = bool(req.streaming)
            if item.streaming and not self.decoupled:
                raise KitUsageError("streaming needs the model's decoupled transaction policy; send streaming "
                                    "false or regenerate the repository with decoupled mode.")
            exclude = req.exclude_input_in_output
            item.exclude_input = self.exclude_input if exclude is None else exclude
            assert isinstance(req.prompt, tuple), "tensorrt_llm prompts are token ids"
            item.seq = self.engine.add_request(list(req.prompt), params, lora=self._lora(req.lora))
        except Exception as exc:  # any bad request is answered with its error; the engine loop goes on
            full = isinstance(exc, QueueFullError)
            self._finish(item, pb_utils.TritonError(str(exc), pb_utils.TritonError.UNAVAILABLE if full
                                                    else pb_utils.TritonError.INVALID_ARG))
            return
        for seq in item.seq.group:
            self.active[seq.seq_id] = item

    def _lora(self, lora: LoraAdapter | None) -> LoraRequest | None:
        """The request's adapter as the runtime takes it: its task id and, when sent, its rows (None: no LoRA)."""
        if lora is None:
            return None
        assert lora.task_id is not None, "a tensorrt_llm adapter has a task id"
        if lora.weights is None or lora.config is None:
            return LoraRequest(lora.task_id)
        model = self.engine.model
        return LoraRequest(lora.task_id, from_rows(torch.from_numpy(lora.weights),
                                                   torch.from_numpy(lora.config.astype(np.int64)),
                                                   model.config, model.dtype))

    def _compiling(self, item: _Pending) -> bool:
        """Start compiling the request's guide (``guided_decoding_guide_type``), once; True while it compiles: the
        request waits aside and comes back through the inbox when its guide is ready (or refused)."""
        if item.guide is None:
            assert item.wire is not None, "the request is decoded"
            if item.wire.guide is None:
                return False
            if self.guides is None:
                raise KitUsageError("guided decoding needs the xgrammar_tokenizer_info_path parameter; rebuild the "
                                    "repository from a model with a tokenizer.json.")
            item.guide = self.guides.compile(Guide(*item.wire.guide))
        if item.guide.done():
            self.parked.discard(item)
            return False
        self.parked.add(item)
        item.guide.add_done_callback(lambda _: self.inbox.put(item))
        return True

    def _cancel(self, item: _Pending) -> None:
        for seq in item.admitted.group:
            self.engine.cancel(seq)

    def _stop(self, item: _Pending) -> None:
        """Cancel the running requests with ``item``'s request id; answer ``item`` with an empty final response."""
        request_id = item.request.request_id()
        for other in {id(p): p for p in self.active.values()
                      if request_id and p.request.request_id() == request_id}.values():
            self._cancel(other)
            self._finish(other, pb_utils.TritonError("the request was stopped", pb_utils.TritonError.CANCELLED))
        self._finish(item, None, pb_utils.InferenceResponse(output_tensors=[]))

    def _outputs(self, item: _Pending, seq: Sequence, token_ids: list[int], first: int) -> list:
        """The response tensors of ``token_ids``, whose generated tokens begin at output position ``first``."""
        req = item.wire
        assert req is not None, "the request is decoded"
        perf = perf_of(seq, self.engine.config.tokens_per_block) if req.return_perf_metrics else None
        response = response_of(seq, req, token_ids, first, with_prompt=first == 0, perf=perf)
        return [pb_utils.Tensor(name, array[None]) for name, array in encode_trtllm_response(response).items()]

    def _progress(self, item: _Pending, seq: Sequence) -> None:
        """Stream the new tokens of ``seq``, or answer it in full when it finished; the request's last sequence to
        finish sends the final flag."""
        if seq.finish_reason == "error":  # this request alone could not run; the client is told why
            self._cancel(item)
            self._finish(item, pb_utils.TritonError(seq.error or "the request failed",
                                                    pb_utils.TritonError.INVALID_ARG))
            return
        if seq.is_finished:
            del self.active[seq.seq_id]
        is_last = seq.is_finished and not any(self.active.get(other.seq_id) is item for other in seq.group)
        sent = item.num_sent.get(seq.index, 0)
        if item.streaming:
            new = seq.output_ids[sent:]
            item.num_sent[seq.index] = sent + len(new)
            if new or (sent == 0 and seq.is_finished):  # the first response carries the prompt's outputs
                response = pb_utils.InferenceResponse(self._outputs(item, seq, new, sent))
            else:
                response = None
            if is_last:
                item.sender.send(response, flags=FINAL)
            elif response is not None:
                item.sender.send(response)
        elif seq.is_finished:
            tokens = seq.output_ids if item.exclude_input else seq.token_ids
            response = pb_utils.InferenceResponse(self._outputs(item, seq, tokens, 0))
            if is_last:
                self._finish(item, None, response)
            else:
                item.sender.send(response)

    def _finish(self, item: _Pending, error, response=None) -> None:
        """Send the final response (an error, or ``response``) and forget the request."""
        if item.seq is not None:
            for seq in item.seq.group:
                self.active.pop(seq.seq_id, None)
        response = response or pb_utils.InferenceResponse(output_tensors=[], error=error)
        if item.sender is not None:
            item.sender.send(response, flags=FINAL)
        else:
            item.response = response
            item.done.set()

    def _publish(self) -> None:
        stats = asdict(self.engine.stats())
        stats["blocks_fraction"] = stats["blocks_used"] / max(stats["blocks_max"], 1)  # the C++ backend's "fraction"
        for field, value in stats.items():
            if field in self.metrics:
                self.metrics[field].set(float(value))
