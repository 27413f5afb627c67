"""The ``tensorrt_llm`` model of the llmapi target: a Triton Python-backend model over TensorRT-LLM's public LLM API.

Written by trtllm-kit against the documented API (``LLM``, ``SamplingParams``, ``generate_async``, ``abort``,
``get_stats``, ``shutdown``). Its tensors are upstream's ``llmapi`` interface plus what benchmarks, evaluations,
disaggregated serving, LoRA and autoscalers need; the wire's llmapi codec (``trtllm_kit.wire.llmapi``,
``llmapi_response``) reads and writes them, refusing a bad value by its tensor's name. The LLM API's arguments
come from ``llmapi_params.py``, the responses from ``llmapi_outputs.py``; the C++ backend's gauges
(``llmapi_gauges.py``) are custom metrics.

``model.yaml`` (next to this file, or ``$LLM_CONFIG_PATH``) holds the ``LLM()`` arguments and ``triton_config``.
Several instances each run their own ``LLM`` on their own GPUs (``llmapi_instances.py``): the instance's group
becomes ``CUDA_VISIBLE_DEVICES`` before TensorRT-LLM is imported. A request's ``priority`` goes to
``generate_async(priority=...)`` where the installed LLM API has that parameter. The classes are TensorRT-LLM's
with a GPU, else the kit's CPU runtime behind the same interface (``llmapi_classes.py``), which computes with the
runtime's default torch threads (``runtime/threads.py``). The model needs
trtllm-kit installed where Triton runs (the serving image installs it).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from typing import Any

import triton_python_backend_utils as pb_utils
import yaml

try:
    from trtllm_kit.llmapi.disaggregated_params import params_of
    from trtllm_kit.runtime.handle import Failure, failure_of
    from trtllm_kit.runtime.threads import compute_with, default_threads
    from trtllm_kit.triton_models.llmapi_adapters import Adapters
    from trtllm_kit.triton_models.llmapi_classes import llm_classes
    from trtllm_kit.triton_models.llmapi_gauges import make_gauges, stat_value
    from trtllm_kit.triton_models.llmapi_instances import instance_gpus
    from trtllm_kit.triton_models.llmapi_outputs import completion_responses
    from trtllm_kit.triton_models.llmapi_params import check_mode, is_client_error, sampling_params
    from trtllm_kit.triton_models.spec_decode_counters import SpecDecodeCounters
    from trtllm_kit.triton_models.triton_io import failure_error, input_arrays, output_tensors
    from trtllm_kit.wire import GenerationRequest, GenerationResponse
    from trtllm_kit.wire.llmapi import decode_llmapi_request, request_tensors
    from trtllm_kit.wire.llmapi_response import encode_llmapi_response
    from trtllm_kit.wire.tensor import is_stop_request, strings_array

    NOT_AVAILABLE = {"text_output": strings_array(["N/A"])}

    KIT_MISSING: ImportError | None = None
except ImportError as exc:  # said by initialize, where Triton shows it
    KIT_MISSING = exc

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
TRITON_ONLY = ("triton_config", "logits_post_processors")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        if KIT_MISSING is not None:
            raise RuntimeError(f"the llmapi model needs the trtllm-kit package where Triton runs ({KIT_MISSING}); "
                               "run pip install trtllm-kit in the serving image.")
        self.inputs = tuple(t.name for t in request_tensors())
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(model_dir, os.environ.get("LLM_CONFIG_PATH", "model.yaml"))) as f:
            config = yaml.safe_load(f)
        triton = config["triton_config"]
        self.decoupled = bool(triton["decoupled"])
        self.cancel_period = int(triton.get("cancellation_check_period_ms", 100)) / 1000
        llm_args = {k: v for k, v in config.items() if k not in TRITON_ONLY}
        index, count, gpus = instance_gpus(args)
        if gpus is not None:  # before torch or TensorRT-LLM is imported: this process then sees only its GPUs
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["TRTLLM_VISIBLE_DEVICES"] = gpus
        self.classes = llm_classes()
        threads = default_threads() if self.classes.on_cpu else None
        if threads is not None:
            compute_with(threads)
        self.adapters = Adapters(os.path.dirname(os.path.abspath(config["model"])))  # model: OUT/checkpoint
        pb_utils.Logger.log_info(f"tensorrt_llm instance {index} of {count}: {self.classes.llm.__module__}.LLM on "
                                 f"{'GPU ' + gpus if gpus is not None else 'the visible devices'}")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="llmapi-loop", daemon=True)
        self.thread.start()
        self.llm = self.classes.llm(**llm_args)
        if threads is not None:
            self.llm.engine.step_threads = threads
        self.takes_priority = "priority" in inspect.signature(self.llm.generate_async).parameters
        self.priority_noted = False
        self.inflight: dict[str, list] = {}  # triton request id → running results (for the ``stop`` input)
        self.pending: set = set()
        labels = {"model": args["model_name"], "version": args["model_version"]}
        if count > 1:  # several LLMs in one server: a gauge each, summed by whoever scrapes them
            labels["model_instance"] = str(index)  # not "instance": Prometheus keeps that for the scraped target
        self.families, self.gauges = make_gauges(pb_utils, labels)
        self.spec_counters = SpecDecodeCounters(pb_utils, args["model_name"])  # vLLM's names
        self.metrics_task = asyncio.run_coroutine_threadsafe(self._publish(), self.loop)

    def execute(self, requests):
        if not self.decoupled:
            futures = [asyncio.run_coroutine_threadsafe(self._run(r, None), self.loop) for r in requests]
            return [future.result() for future in futures]
        for request in requests:
            future = asyncio.run_coroutine_threadsafe(self._run(request, request.get_response_sender()), self.loop)
            self.pending.add(future)
            future.add_done_callback(self.pending.discard)
        return None

    def finalize(self) -> None:
        for future in list(self.pending):
            future.cancel()
        self.metrics_task.cancel()
        self.llm.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def _run(self, request, sender):
        """One request from tensors to responses; an error becomes an error response with ``N/A`` text."""
        request_id = request.request_id()
        try:
            arrays = input_arrays(pb_utils, request, self.inputs)
            if is_stop_request(arrays):
                for result in self.inflight.get(request_id, []):
                    result.abort()
                return self._send(sender, self._failed(None), final=True)
            req = decode_llmapi_request(arrays)
            check_mode(req, self.decoupled)
            result = self.llm.generate_async(req.prompt if isinstance(req.prompt, str) else list(req.prompt),
                                             sampling_params(req, self.classes.sampling_params,
                                                             self.classes.guided_decoding_params),
                                             streaming=bool(req.streaming),
                                             **self._extras(req))
            running = self.inflight.setdefault(request_id, [])
            running.append(result)
            watcher = asyncio.ensure_future(self._watch(request, result)) if sender is not None else None
            try:
                return await self._answer(req, result, sender)
            finally:
                if watcher is not None:
                    watcher.cancel()
                running.remove(result)
                if not running:
                    self.inflight.pop(request_id, None)
        except asyncio.CancelledError:
            error = failure_error(pb_utils, "the request was cancelled", Failure.CANCELLED)
            return self._send(sender, self._failed(error), final=True)
        except Exception as exc:  # every failure is answered; the model goes on serving
            kind = Failure.INVALID if is_client_error(exc) else failure_of(exc)
            error = failure_error(pb_utils, f"{type(exc).__name__}: {exc}", kind)
            return self._send(sender, self._failed(error), final=True)

    async def _answer(self, req: GenerationRequest, result, sender):
        """Send the generation's responses: each step's when streamed, else the whole completions."""
        reported: set[int] = set()  # completions whose finish was sent
        if req.streaming:
            async for output in result:
                responses = completion_responses(req, output, diff=True, reported=reported)
                for i, response in enumerate(responses):
                    self._send(sender, self._response(response), final=output.finished and i == len(responses) - 1)
                if output.finished:
                    return None if responses else self._send(sender, None, final=True)
            return self._send(sender, None, final=True)
        output = await result.aresult()
        if output.outputs[0].finish_reason == "cancelled":
            raise asyncio.CancelledError
        responses = completion_responses(req, output, diff=False, reported=reported)
        for response in responses[:-1]:
            self._send(sender, self._response(response), final=False)
        return self._send(sender, self._response(responses[-1]), final=True)

    async def _watch(self, request, result) -> None:
        """Abort the generation when Triton reports the request cancelled (polled every period)."""
        while True:
            await asyncio.sleep(self.cancel_period)
            if request.is_cancelled():
                result.abort()
                return

    def _extras(self, req: GenerationRequest) -> dict[str, Any]:
        """``generate_async``'s other arguments: ``priority`` (where the installed LLM API takes it; otherwise said
        once in the log), ``disaggregated_params`` and ``lora_request``."""
        extras: dict[str, Any] = {}
        if req.priority is not None and self.takes_priority:
            extras["priority"] = req.priority
        elif req.priority is not None and not self.priority_noted:
            self.priority_noted = True
            pb_utils.Logger.log_warn("request priority is ignored: this TensorRT-LLM's LLM.generate_async has no "
                                     "priority parameter")
        if req.disaggregated is not None:
            extras["disaggregated_params"] = params_of(req.disaggregated, self.classes.disaggregated_params)
        if req.lora is not None:
            extras["lora_request"] = self.adapters.request(req.lora.name, self.classes.lora_request)
        return extras

    def _response(self, response: GenerationResponse):
        return pb_utils.InferenceResponse(output_tensors(pb_utils, encode_llmapi_response(response), batched=False))

    def _failed(self, error):
        """The answer of a stop request (``error`` None) or of a failed one: ``N/A`` text."""
        return pb_utils.InferenceResponse(output_tensors(pb_utils, NOT_AVAILABLE, batched=False), error=error)

    def _send(self, sender, response, final: bool):
        if sender is None:
            return response
        sender.send(response, flags=FINAL if final else 0)
        return None

    async def _publish(self) -> None:
        """Copy the newest iteration statistics into the gauges, twice a second."""
        while True:
            try:
                stats = await self.loop.run_in_executor(None, self.llm.get_stats, 0.1)
                if stats:
                    self.spec_counters.add_iterations(stats)
                    latest = stats[-1] if isinstance(stats[-1], dict) else {}
                    for path, metric in self.gauges:
                        metric.set(stat_value(latest, path))
            except Exception as exc:  # statistics are best effort; serving goes on
                pb_utils.Logger.log_warn(f"llmapi gauges: {exc!r}")
            await asyncio.sleep(0.5)
