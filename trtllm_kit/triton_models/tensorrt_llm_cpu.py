"""The ``tensorrt_llm`` model on CPU: a Triton Python-backend model running the kit's in-flight batching runtime.

It takes the upstream tensors and answers with upstream's (``output_ids``, ``sequence_length`` and the optional
outputs), so clients and the ensemble cannot tell it from the GPU backend; the tensors and their rules are the wire's
``tensorrt_llm`` codec (``trtllm_kit.wire.trtllm``, ``trtllm_response``; docs/openai-eval-engine.md), the runtime's
settings ``runtime/request.py``, the response ``runtime/response.py``. The engine runs in the engine loop's thread
(``runtime/loop.py``); ``execute`` decodes and submits. In decoupled mode each step's new tokens are streamed, one
response stream per sequence with its ``sequence_index``, sent by the outbox's thread (``outbox.py``), which then asks
tritonserver whether the request was cancelled, so the engine thread waits for neither, unless it is ``OUTBOX_TURNS``
turns of responses ahead of the sends; a request the outbox has not asked about since the loop last looked (one waiting,
computing its prompt or answered whole) is asked by the engine thread, at most every ``ASK_PERIOD_S``. A cancelled
request is dropped at the next turn, and so are those named by a request with ``stop = true`` and the same request id
(how the TensorRT-LLM backend stops a request, and how ``tensorrt_llm_bls`` stops its inner call when its client
leaves). A guide (``guided_decoding_guide_type``) compiles in a process of its own (``runtime/guide_service.py``) and
the request joins the loop once it has. Tokens sent in ``draft_input_ids`` (``tensorrt_llm_bls``'s draft-target loop)
are verified in the step after the prompt's (``runtime/external_drafts.py``); ``draft_logits`` are refused. With the
parameter ``speculative_decoding_mode`` (``ngram``, or ``draft-target`` with ``draft_model_path``) a request without
drafts takes prompt-lookup or draft-model drafts (``cpu_speculation.py``).
Configuration: the model's ``parameters`` (``cpu_parameters.py``: ``gpt_model_path``, the engine's fields of
``EngineConfig``, ``exclude_input_in_output``, ``cpu_threads``, ``xgrammar_tokenizer_info_path``, the LoRA cache's
size).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.grammar import CompiledGuide, Guide, tokenizer_info_file
from trtllm_kit.runtime.guide_service import GuideService
from trtllm_kit.runtime.handle import Failure
from trtllm_kit.runtime.loop import EngineLoop, Submission
from trtllm_kit.runtime.lora import AdapterWeights, cache_capacity, from_rows
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.request import sampling_params
from trtllm_kit.runtime.response import perf_of, response_of
from trtllm_kit.runtime.sequence import SamplingParams, Sequence
from trtllm_kit.runtime.stats import GAUGES, gauge_values
from trtllm_kit.runtime.threads import compute_with, on_passing_thread
from trtllm_kit.triton_models.cpu_parameters import CpuParameters
from trtllm_kit.triton_models.cpu_speculation import cpu_speculator
from trtllm_kit.triton_models.outbox import Outbox
from trtllm_kit.triton_models.spec_decode_counters import SpecDecodeCounters
from trtllm_kit.triton_models.triton_io import failure_error, input_arrays, output_tensors, triton_error
from trtllm_kit.wire import GenerationRequest, LoraAdapter
from trtllm_kit.wire.tensor import is_stop_request
from trtllm_kit.wire.trtllm import decode_trtllm_request, request_tensors
from trtllm_kit.wire.trtllm_response import encode_trtllm_response

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUTS = tuple(t.name for t in request_tensors())  # every input the wire reads
ASK_PERIOD_S = 0.02  # the engine thread asks whether a request without responses was cancelled at most this often
OUTBOX_TURNS = 2  # how many turns of responses (one per running sequence) the engine may be ahead of their sends


def _error(error: Any) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class _Request:
    """One Triton request as the engine loop's handle: answered through its sender by the model's outbox
    (decoupled) or once to ``execute`` (``done``)."""

    def __init__(self, model: TritonPythonModel, request: Any, sender: Any) -> None:
        self.model, self.request, self.sender = model, request, sender
        self.wire: GenerationRequest | None = None  # the request as decoded
        self.exclude_input = model.parameters.exclude_input
        self.num_sent: dict[int, int] = {}  # sequence index → output tokens sent
        self.response: Any = None
        self.done = threading.Event()
        self.send_error: Exception | None = None  # what a send on the outbox raised
        self.cancelled = False  # tritonserver's last answer to is_cancelled
        self.asked_at = self.looked_at = -float("inf")  # when it was last asked; when the loop last looked

    def progress(self, seq: Sequence, is_last: bool) -> None:
        """Stream the new tokens of ``seq``, or answer it in full when it finished; the last sends the final flag."""
        assert self.wire is not None, "a submitted request is decoded"
        sent = self.num_sent.get(seq.index, 0)
        if self.wire.streaming:
            new = seq.output_ids[sent:]
            self.num_sent[seq.index] = sent + len(new)
            # the first response carries the prompt's outputs
            response = self._response(seq, new, sent) if new or (sent == 0 and seq.is_finished) else None
            if is_last:
                self._send(response, FINAL)
            elif response is not None:
                self._send(response, 0)
        elif seq.is_finished:
            response = self._response(seq, seq.output_ids if self.exclude_input else seq.token_ids, 0)
            if is_last:
                self.answer(response)
            else:
                self._send(response, 0)

    def failed(self, message: str, kind: Failure) -> None:
        self.answer(_error(failure_error(pb_utils, message, kind)))

    def is_cancelled(self) -> bool:
        """Whether tritonserver said the request was cancelled: the outbox's answer after the last response, or
        asked now when the outbox has not asked since the loop last looked and for ``ASK_PERIOD_S``."""
        if not self.cancelled and self.asked_at <= self.looked_at and time.monotonic() - self.asked_at >= ASK_PERIOD_S:
            self._ask()
        self.looked_at = time.monotonic()
        return self.cancelled

    def answer(self, response: Any) -> None:
        """Send the request's final response."""
        if self.sender is not None:
            self._send(response, FINAL)
        else:
            self.response = response
            self.done.set()

    def _send(self, response: Any, flags: int) -> None:
        """Hand ``response`` to the outbox; a send the outbox could not make fails this one (the loop then ends
        the request)."""
        if self.send_error is not None:
            raise self.send_error
        self.model.outbox.put(lambda: self._deliver(response, flags))

    def _deliver(self, response: Any, flags: int) -> None:
        """Send ``response`` (outbox thread); until the final one, then ask whether the request was cancelled."""
        try:
            self.sender.send(response, flags=flags)
        except Exception as exc:
            self.send_error = exc
            raise
        if flags != FINAL:
            self._ask()

    def _ask(self) -> None:
        self.cancelled, self.asked_at = bool(self.request.is_cancelled()), time.monotonic()

    def _response(self, seq: Sequence, token_ids: list[int], first: int) -> Any:
        """The response of ``token_ids``, whose generated tokens begin at output position ``first``."""
        req = self.wire
        assert req is not None, "a submitted request is decoded"
        perf = perf_of(seq, self.model.engine.config.tokens_per_block) if req.return_perf_metrics else None
        response = response_of(seq, req, token_ids, first, with_prompt=first == 0, perf=perf)
        return pb_utils.InferenceResponse(output_tensors(pb_utils, encode_trtllm_response(response), batched=True))


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.parameters = p = CpuParameters.from_config(json.loads(args["model_config"]),
                                                        Path(args["model_repository"]))
        compute_with(p.cpu_threads)
        values, lora_cache = dict(p.values), p.lora_cache_size()
        if lora_cache is not None:  # the backend's cache in bytes, as adapters
            checkpoint = json.loads((p.checkpoint / "config.json").read_text())
            values["lora_cache_max_adapters"] = str(cache_capacity(checkpoint, *lora_cache))
        config = EngineConfig.from_parameters(values)  # draft_input_ids verified in the step, within its budget

        def engine() -> Executor:
            model = CheckpointModel.load(p.checkpoint)
            return Executor(model, config, cpu_speculator(values, config, Path(args["model_repository"]),
                                                          model.dims.vocab_size))

        self.engine = on_passing_thread(engine)  # the engine thread's OpenMP pool is then the process's only one
        self.engine.step_threads = p.cpu_threads
        info, vocab_size = p.tokenizer_info, self.engine.model.dims.vocab_size
        self.guides = None if info is None else GuideService(lambda: tokenizer_info_file(info, vocab_size))
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.gauges, self.families = {}, []  # a family must outlive its metrics
        self.published: dict[str, float] = {}  # each gauge's value as last set
        for family, (label, by_value) in GAUGES.items():
            self.families.append(pb_utils.MetricFamily(name=family, description=f"CPU runtime {label}",
                                                       kind=pb_utils.MetricFamily.GAUGE))
            self.gauges.update({field: self.families[-1].Metric(labels={**labels, label: value})
                                for value, field in by_value.items()})
        speculator = self.engine.speculator
        self.spec_counters = None if speculator is None else SpecDecodeCounters(pb_utils, args["model_name"],
                                                                                  speculator.counts)
        self.outbox = Outbox(max_pending=OUTBOX_TURNS * config.max_batch_size)
        self.loop = EngineLoop(self.engine, on_turn=self._publish)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        decoupled = self.parameters.is_decoupled
        handles = [self._take(_Request(self, r, r.get_response_sender() if decoupled else None)) for r in requests]
        if decoupled:
            return None
        for handle in handles:
            handle.done.wait()
        return [handle.response for handle in handles]

    def finalize(self) -> None:
        self.loop.shutdown("the server is shutting down")
        self.outbox.close()
        if self.guides is not None:
            self.guides.close()

    def _take(self, handle: _Request) -> _Request:
        """Decode a request and submit it (once its guide compiled); a bad one is answered with its error."""
        try:
            arrays = input_arrays(pb_utils, handle.request, INPUTS)
            if is_stop_request(arrays):  # answered after the requests it stops
                self.loop.stop_request_id(handle.request.request_id())
                self.loop.call(lambda: handle.answer(pb_utils.InferenceResponse(output_tensors=[])))
                return handle
            handle.wire = req = decode_trtllm_request(arrays)
            if (req.n or 1) > 1 and not self.parameters.is_decoupled:
                raise KitUsageError("num_return_sequences > 1 needs the model's decoupled transaction policy (one "
                                    "response per sequence); send 1 or regenerate the repository with decoupled mode.")
            if req.streaming and not self.parameters.is_decoupled:
                raise KitUsageError("streaming needs the model's decoupled transaction policy; send streaming "
                                    "false or regenerate the repository with decoupled mode.")
            if req.exclude_input_in_output is not None:
                handle.exclude_input = req.exclude_input_in_output
            params = sampling_params(req)
            if req.guide is None:
                self._submit(handle, params)
            elif self.guides is None:
                raise KitUsageError("guided decoding needs the xgrammar_tokenizer_info_path parameter; rebuild the "
                                    "repository from a model with a tokenizer.json.")
            else:
                self.guides.compile(Guide(*req.guide)).add_done_callback(
                    lambda done: self._compiled(handle, params, done))
        except Exception as exc:  # any bad request is answered with its error
            handle.answer(_error(triton_error(pb_utils, exc)))
        return handle

    def _compiled(self, handle: _Request, params: SamplingParams, guide: Future[CompiledGuide]) -> None:
        try:
            self._submit(handle, replace(params, guide=guide.result()))
        except Exception as exc:  # a refused guide, or the compiler's failure
            handle.answer(_error(triton_error(pb_utils, exc)))

    def _submit(self, handle: _Request, params: SamplingParams) -> None:
        req = handle.wire
        assert req is not None and isinstance(req.prompt, tuple), "tensorrt_llm prompts are token ids"
        self.loop.submit(Submission(handle, list(req.prompt), params, lora=self._lora(req.lora),
                                    request_id=handle.request.request_id()))

    def _lora(self, lora: LoraAdapter | None) -> AdapterWeights | None:
        """The request's adapter as the runtime takes it: its task id and, when sent, its rows (None: no LoRA)."""
        if lora is None:
            return None
        assert lora.task_id is not None, "a tensorrt_llm adapter has a task id"
        if lora.weights is None or lora.config is None:
            return AdapterWeights(lora.task_id)
        model = self.engine.model
        return AdapterWeights(lora.task_id, from_rows(torch.from_numpy(lora.weights),
                                                   torch.from_numpy(lora.config.astype(np.int64)),
                                                   model.config, model.dtype))

    def _publish(self) -> None:
        """Set the gauges whose value the turn changed (each set waits for tritonserver's answer), then the
        speculation counters (engine thread)."""
        for field, value in gauge_values(self.engine.stats()).items():
            if field in self.gauges and self.published.get(field) != value:
                self.gauges[field].set(value)
                self.published[field] = value
        if self.spec_counters is not None:
            self.spec_counters.publish()
