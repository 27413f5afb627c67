"""The ``tensorrt_llm`` model of the llmapi target: a Triton Python-backend model over TensorRT-LLM's public LLM API.

Written by trtllm-kit against the documented API (``LLM``, ``SamplingParams``, ``generate_async``, ``abort``,
``get_stats``, ``shutdown``). Its tensors are upstream's ``llmapi`` interface (``text_input``, ``streaming``,
``sampling_param_*``, ``return_finish_reason``, ``return_stop_reason``, ``return_cumulative_logprob``, ``stop``
→ ``text_output``, ``finish_reason``, ``stop_reason``, ``cumulative_logprob``) plus what benchmarks and
autoscalers need: ``input_ids`` in place of text, ``output_ids`` and the token counts out, and the C++
backend's gauges ``nv_trt_llm_request_metrics`` / ``nv_trt_llm_kv_cache_block_metrics`` as custom metrics.

``model.yaml`` (next to this file, or ``$LLM_CONFIG_PATH``) holds the ``LLM()`` arguments and ``triton_config``.
Several instances each run their own ``LLM`` on their own GPUs: ``config.pbtxt``'s ``gpu_device_ids`` parameter
("0,1;2,3", one group per instance) sets ``CUDA_VISIBLE_DEVICES`` in each instance's process before TensorRT-LLM
is imported. A request's ``priority`` (FP32 in [0, 1], higher first) goes to ``generate_async(priority=...)``
where the installed LLM API has that parameter.
The class is ``tensorrt_llm.LLM`` where TensorRT-LLM and a GPU are present, else the kit's CPU runtime behind
the same interface (``trtllm_kit.llmapi.cpu_llm.LLM``); nothing else differs.

Evaluation extras (docs/openai-eval-engine.md): ``sampling_param_n`` / ``sampling_param_best_of`` (with
``sampling_param_n`` each completion is its own response carrying ``sequence_index``; decoupled mode for n > 1),
``sampling_param_min_p`` / ``sampling_param_repetition_penalty``, ``sampling_param_logprobs`` N →
``output_log_probs`` and ``top_log_probs`` / ``top_log_prob_ids`` [tokens, N], ``sampling_param_prompt_logprobs`` N
→ ``prompt_log_probs`` / ``prompt_top_log_probs`` / ``prompt_top_log_prob_ids`` (first response of a completion;
the first prompt token's row is 0 / -1), ``keep_end_token`` (the token that ends a completion is the last of
``output_ids``, with its logprob, where the ``SamplingParams`` class has that field: the kit's CPU one; TensorRT-LLM's
has none, and there the input is ignored), and ``guided_decoding_guide_type`` / ``guided_decoding_guide`` (json,
json_schema, regex, ebnf_grammar, choice: a JSON array of strings) → ``GuidedDecodingParams``.

Disaggregated serving (docs/disaggregation.md): ``disaggregated_params``, a JSON object in the OpenAI wire form
(``request_type``, ``first_gen_tokens``, ``ctx_request_id``, ``encoded_opaque_state`` base64, ...), becomes
``generate_async(disaggregated_params=DisaggregatedParams(...))``; a context-only request's final response
carries the parameters it returned in the same form.

LoRA: ``lora_name`` names one of the artifact's adapters (``manifest.json`` beside ``model``'s directory); the
request runs with ``LoRARequest(name, id from the adapter's sha256, OUT/lora/NAME)``, a PEFT directory.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import os
import re
import threading
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
TRITON_ONLY = ("triton_config", "logits_post_processors")
SAMPLING = {  # input → (SamplingParams field, numpy → python)
    "sampling_param_best_of": ("best_of", int), "sampling_param_temperature": ("temperature", float),
    "sampling_param_top_k": ("top_k", int), "sampling_param_top_p": ("top_p", float),
    "sampling_param_frequency_penalty": ("frequency_penalty", float),
    "sampling_param_presence_penalty": ("presence_penalty", float),
    "sampling_param_max_tokens": ("max_tokens", int), "sampling_param_seed": ("seed", int),
    "sampling_param_exclude_input_from_output": ("exclude_input_from_output", bool),
    "sampling_param_return_perf_metrics": ("return_perf_metrics", bool),
    "sampling_param_min_tokens": ("min_tokens", int), "sampling_param_end_id": ("end_id", int),
    "sampling_param_ignore_eos": ("ignore_eos", bool), "sampling_param_n": ("n", int),
    "sampling_param_min_p": ("min_p", float), "sampling_param_repetition_penalty": ("repetition_penalty", float),
    "sampling_param_logprobs": ("logprobs", int), "sampling_param_prompt_logprobs": ("prompt_logprobs", int),
    "sampling_param_include_stop_str_in_output": ("include_stop_str_in_output", bool),
}
# guided_decoding_guide_type → GuidedDecodingParams field (choice becomes an EBNF grammar)
GUIDES = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar",
          "choice": "grammar"}
# Below this temperature logits divided by it overflow: it is greedy (top_k 1), as in vLLM. The kit states the same
# value in trtllm_kit/runtime/sampling_rules.py; this file runs where the kit may not be installed.
MIN_TEMPERATURE = 1e-5
# Exceptions that mean the request, not the server, is wrong (tensorrt_llm's and the kit's): answered INVALID_ARG
CLIENT_ERRORS = ("ValueError", "RequestError", "KitUsageError", "ModelError")
GAUGES: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {  # family → (label, {label value: key path})
    "nv_trt_llm_request_metrics": ("request_type", {
        "active": ("numActiveRequests",), "max": ("maxNumActiveRequests",), "waiting": ("numQueuedRequests",),
        "scheduled": ("inflightBatchingStats", "numScheduledRequests"),
        "context": ("inflightBatchingStats", "numContextRequests")}),
    "nv_trt_llm_kv_cache_block_metrics": ("kv_cache_block_type", {
        "max": ("kvCacheStats", "maxNumBlocks"), "free": ("kvCacheStats", "freeNumBlocks"),
        "used": ("kvCacheStats", "usedNumBlocks"), "tokens_per": ("kvCacheStats", "tokensPerBlock")}),
    "trtllm_kit_kv_transfer_metrics": ("kv_transfer_type", {  # the CPU runtime's cache transceiver
        "held": ("kvTransferStats", "numHeldRequests"), "transfers": ("kvTransferStats", "numTransfers"),
        "seconds": ("kvTransferStats", "transferSeconds")}),
}
DISAGG_WIRE = ("request_type", "first_gen_tokens", "ctx_request_id", "draft_tokens", "disagg_request_id")


def llm_class():
    """``tensorrt_llm``'s ``LLM``, ``SamplingParams``, ``GuidedDecodingParams`` and ``LoRARequest`` with a GPU, else
    the kit's CPU ones."""
    try:
        import torch

        if torch.cuda.is_available():
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.executor.request import LoRARequest
            from tensorrt_llm.sampling_params import GuidedDecodingParams

            return LLM, SamplingParams, GuidedDecodingParams, LoRARequest
    except ImportError:
        pass
    from trtllm_kit.llmapi.cpu_llm import LLM, GuidedDecodingParams, LoRARequest, SamplingParams

    return LLM, SamplingParams, GuidedDecodingParams, LoRARequest


def lora_int_id(sha256: str) -> int:
    """An adapter's ``lora_int_id``: from the sha256 of its weights, so one id always names one adapter (the LoRA
    cache's key) across restarts and servers, and a changed adapter gets a new one; in [1, 2**60].

    Arguments:
        sha256: the adapter record's ``sha256``.
    """
    return 1 + int(sha256[:15], 16)


class Adapters:
    """The artifact's adapters by name, from its ``manifest.json`` (read again when it changes, so an adapter added
    or removed with ``trtllm-kit lora`` is seen without a restart)."""

    def __init__(self, artifact_dir: str) -> None:
        self.artifact_dir = artifact_dir
        self.manifest = os.path.join(artifact_dir, "manifest.json")
        self.stamp: int | None = None
        self.records: dict[str, dict] = {}

    def request(self, name: str, request_class):
        """The ``LoRARequest`` of the adapter ``name``; a name the manifest does not hold is refused.

        Arguments:
            name: the ``lora_name`` input; request_class: ``LoRARequest``.
        """
        stamp = os.stat(self.manifest).st_mtime_ns if os.path.exists(self.manifest) else None
        if stamp != self.stamp:
            self.records = {}
            if stamp is not None:
                with open(self.manifest) as f:
                    self.records = json.load(f).get("summary", {}).get("adapters", {})
            self.stamp = stamp
        record = self.records.get(name)
        if record is None:
            raise ValueError(f"LoRA adapter {name!r} is not in the artifact {self.artifact_dir} (it has: "
                             f"{', '.join(sorted(self.records)) or 'none'}); add it with trtllm-kit lora add")
        return request_class(name, lora_int_id(record["sha256"]), os.path.join(self.artifact_dir, record["dir"]))


def disaggregated_params_class():
    """``tensorrt_llm.llmapi.DisaggregatedParams`` with a GPU, else the kit's CPU one."""
    try:
        import torch

        if torch.cuda.is_available():
            from tensorrt_llm.llmapi import DisaggregatedParams

            return DisaggregatedParams
    except ImportError:
        pass
    from trtllm_kit.llmapi.cpu_llm import DisaggregatedParams

    return DisaggregatedParams


def disaggregated_params(text: str, params_class):
    """``DisaggregatedParams`` from the wire form's JSON (``encoded_opaque_state`` is base64).

    Arguments:
        text: the ``disaggregated_params`` tensor; params_class: the class.
    """
    wire = json.loads(text)
    if not isinstance(wire, dict):
        raise ValueError(f"disaggregated_params must be a JSON object, got {text[:80]!r}")
    values = {name: wire[name] for name in DISAGG_WIRE if wire.get(name) is not None}
    if wire.get("encoded_opaque_state") is not None:
        values["opaque_state"] = base64.b64decode(wire["encoded_opaque_state"])
    return params_class(**values)


def disaggregated_wire(params) -> str:
    """The wire form's JSON of the ``DisaggregatedParams`` a context-only request returned."""
    wire = {name: getattr(params, name, None) for name in DISAGG_WIRE}
    if getattr(params, "opaque_state", None) is not None:
        wire["encoded_opaque_state"] = base64.b64encode(params.opaque_state).decode()
    return json.dumps({name: value for name, value in wire.items() if value is not None})


def guided_decoding(guide_type: str | None, guide: str, params_class):
    """``GuidedDecodingParams`` from the backend's guide tensors (None without a type); a choice list becomes an
    EBNF grammar of its strings.

    Arguments:
        guide_type: ``guided_decoding_guide_type``; guide: ``guided_decoding_guide``; params_class: the class.
    """
    if guide_type is None:
        return None
    if guide_type not in GUIDES:
        raise ValueError(f"guided_decoding_guide_type is {guide_type!r}; use one of {', '.join(GUIDES)}")
    if guide_type == "json":
        return params_class(json_object=True)
    if guide_type == "choice":
        choices = json.loads(guide) if guide.startswith("[") else None
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError(f"a choice guide must be a JSON array of strings, got {guide[:80]!r}")
        guide = "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    return params_class(**{GUIDES[guide_type]: guide})


def _top(entries: list, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[len(entries), k] logprobs and ids of each position's k best tokens (by rank) from the LLM API's
    ``{token_id: Logprob}`` dicts; a position without a dict (the first prompt token) gives 0 and -1."""
    values, ids = np.zeros((len(entries), k), np.float32), np.full((len(entries), k), -1, np.int32)
    for row, entry in enumerate(entries):
        ranked = sorted((entry or {}).items(), key=lambda item: item[1].rank or 0)
        for col, (token_id, logprob) in enumerate([item for item in ranked if (item[1].rank or 0) <= k][:k]):
            values[row, col], ids[row, col] = logprob.logprob, token_id
    return values, ids


def logprob_tensors(prefix: str, entries: list, token_ids: list[int], k: int) -> list:
    """``{prefix}log_probs`` (each position's token's logprob) and, for k > 0, ``{prefix}top_log_probs`` /
    ``{prefix}top_log_prob_ids``.

    Arguments:
        prefix: "output_" or "prompt_"; entries: ``{token_id: Logprob}`` per position (None: none); token_ids:
        the tokens scored; k: alternatives per position.
    """
    scored = [0.0 if entry is None or token not in entry else float(entry[token].logprob)
              for entry, token in zip(entries, token_ids, strict=False)]
    tensors = [pb_utils.Tensor(f"{prefix}log_probs", np.array(scored, np.float32))]
    if k > 0:
        values, ids = _top(entries, k)
        top = "top_" if prefix == "output_" else f"{prefix}top_"
        tensors += [pb_utils.Tensor(f"{top}log_probs", values), pb_utils.Tensor(f"{top}log_prob_ids", ids)]
    return tensors


def _scalar(request, name: str, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _strings(request, name: str) -> list[str]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [v.decode() if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


def instance_gpus(args: dict[str, str]) -> tuple[int, int, str | None]:
    """(this instance's index, the instance count, its GPU ids) from ``config.pbtxt``: ``instance_group`` counts
    the instances and the ``gpu_device_ids`` parameter gives one ``;``-separated group per instance; Triton names
    instances ``<group>_<index>``, which gives the index. No parameter: one instance on the visible GPUs."""
    config = json.loads(args.get("model_config") or "{}")
    count = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    ids = config.get("parameters", {}).get("gpu_device_ids", {}).get("string_value", "")
    match = re.search(r"_(\d+)$", args.get("model_instance_name", ""))
    index = int(match.group(1)) if match and count > 1 else 0
    if not ids:
        if count > 1:
            raise ValueError(f"{count} instances need the gpu_device_ids parameter (one GPU group per instance, "
                             "e.g. 0,1;2,3); rebuild with --gpu-device-ids")
        return index, count, None
    groups = [group.strip() for group in ids.split(";")]
    if index >= len(groups):
        raise ValueError(f"instance {index} has no GPU group in gpu_device_ids {ids!r} ({len(groups)} groups)")
    return index, count, groups[index]


def _check_sampling(kwargs: dict[str, Any]) -> None:
    """Refuse a ``top_p`` outside (0, 1] or a negative temperature; make a temperature too small to divide by
    greedy (``top_k`` 1), before any of them reaches the engine."""
    top_p, temperature = kwargs.get("top_p"), kwargs.get("temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if temperature is not None and not temperature >= 0:
        raise ValueError(f"temperature must be at least 0, got {temperature!r}")
    if temperature is not None and temperature < MIN_TEMPERATURE:
        del kwargs["temperature"]
        kwargs.pop("top_p", None)
        kwargs["top_k"] = 1


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
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
        LLM, self.SamplingParams, self.GuidedDecodingParams, self.LoRARequest = llm_class()
        self.adapters = Adapters(os.path.dirname(os.path.abspath(config["model"])))  # model: OUT/checkpoint
        self.DisaggregatedParams = disaggregated_params_class()
        pb_utils.Logger.log_info(f"tensorrt_llm instance {index} of {count}: {LLM.__module__}.LLM on "
                                 f"{'GPU ' + gpus if gpus is not None else 'the visible devices'}")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="llmapi-loop", daemon=True)
        self.thread.start()
        self.llm = LLM(**llm_args)
        self.takes_priority = "priority" in inspect.signature(self.llm.generate_async).parameters
        self.keeps_end_token = "keep_end_token" in inspect.signature(self.SamplingParams).parameters
        self.priority_noted = False
        self.inflight: dict[str, list] = {}  # triton request id → running results (for the ``stop`` input)
        self.pending: set = set()
        labels = {"model": args["model_name"], "version": args["model_version"]}
        if count > 1:  # several LLMs in one server: a gauge each, summed by whoever scrapes them
            labels["model_instance"] = str(index)  # not "instance": Prometheus keeps that for the scraped target
        self.families, self.gauges = [], []
        for family, (label, values) in GAUGES.items():
            metric_family = pb_utils.MetricFamily(name=family, description=f"TensorRT-LLM {label} (LLM.get_stats)",
                                                  kind=pb_utils.MetricFamily.GAUGE)
            self.families.append(metric_family)  # a family must outlive its metrics
            self.gauges += [(path, metric_family.Metric(labels={**labels, label: value}))
                            for value, path in values.items()]
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
            if bool(_scalar(request, "stop", False)):
                for result in self.inflight.get(request_id, []):
                    result.abort()
                return self._send(sender, pb_utils.InferenceResponse(self._text(["N/A"])), final=True)
            prompt, params, streaming = self._convert(request)
            result = self.llm.generate_async(prompt, params, streaming=streaming, **self._priority(request),
                                             **self._disaggregated(request), **self._lora(request))
            self.inflight.setdefault(request_id, []).append(result)
            watcher = asyncio.ensure_future(self._watch(request, result)) if sender is not None else None
            try:
                reported: set[int] = set()  # completions whose finish was sent
                if streaming:
                    async for output in result:
                        final = output.finished
                        responses = self._responses(request, output, diff=True, reported=reported)
                        for i, response in enumerate(responses):
                            self._send(sender, response, final=final and i == len(responses) - 1)
                        if final:
                            return None if responses else self._send(sender, None, final=True)
                    return self._send(sender, None, final=True)
                output = await result.aresult()
                if output.outputs[0].finish_reason == "cancelled":
                    raise asyncio.CancelledError
                responses = self._responses(request, output, diff=False, reported=reported)
                for response in responses[:-1]:
                    self._send(sender, response, final=False)
                return self._send(sender, responses[-1], final=True)
            finally:
                if watcher is not None:
                    watcher.cancel()
                self.inflight.get(request_id, []).remove(result) if result in self.inflight.get(request_id, []) \
                    else None
        except asyncio.CancelledError:
            error = pb_utils.TritonError("the request was cancelled", pb_utils.TritonError.CANCELLED)
            return self._send(sender, pb_utils.InferenceResponse(self._text(["N/A"]), error=error), final=True)
        except Exception as exc:  # every failure is answered; the model goes on serving
            is_client = any(cls.__name__ in CLIENT_ERRORS for cls in type(exc).__mro__)
            error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INVALID_ARG if is_client
                                         else pb_utils.TritonError.INTERNAL)
            return self._send(sender, pb_utils.InferenceResponse(self._text(["N/A"]), error=error), final=True)

    async def _watch(self, request, result) -> None:
        """Abort the generation when Triton reports the request cancelled (polled every period)."""
        while True:
            await asyncio.sleep(self.cancel_period)
            if request.is_cancelled():
                result.abort()
                return

    def _priority(self, request) -> dict:
        """``priority=`` for ``generate_async`` when the request carries one and the installed LLM API takes it
        (its signature says so); otherwise nothing, said once in the log."""
        value = _scalar(request, "priority")
        if value is None:
            return {}
        priority = float(value)
        if not 0.0 <= priority <= 1.0:
            raise ValueError(f"priority must lie in [0, 1] (higher runs first), got {priority}")
        if self.takes_priority:
            return {"priority": priority}
        if not self.priority_noted:
            self.priority_noted = True
            pb_utils.Logger.log_warn("request priority is ignored: this TensorRT-LLM's LLM.generate_async has no "
                                     "priority parameter")
        return {}

    def _disaggregated(self, request) -> dict:
        """``disaggregated_params=`` for ``generate_async`` when the request carries them."""
        texts = _strings(request, "disaggregated_params")
        if not texts or not texts[0]:
            return {}
        return {"disaggregated_params": disaggregated_params(texts[0], self.DisaggregatedParams)}

    def _lora(self, request) -> dict:
        """``lora_request=`` for ``generate_async`` when the request names an adapter (``lora_name``)."""
        name = (_strings(request, "lora_name") or [""])[0]
        return {"lora_request": self.adapters.request(name, self.LoRARequest)} if name else {}

    def _convert(self, request):
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
        texts = _strings(request, "text_input")
        if ids is not None:
            prompt = [int(t) for t in ids.as_numpy().reshape(-1)]
        elif texts:
            prompt = texts[0]
        else:
            raise ValueError("send text_input (a prompt) or input_ids (token ids)")
        kwargs = {}
        for name, (field, cast) in SAMPLING.items():
            value = _scalar(request, name)
            if value is not None:
                kwargs[field] = cast(value.item() if hasattr(value, "item") else value)
        _check_sampling(kwargs)
        if bool(_scalar(request, "keep_end_token", False)) and self.keeps_end_token:
            kwargs["keep_end_token"] = True
        stops = _strings(request, "sampling_param_stop")
        if stops:
            kwargs["stop"] = stops
        guide_type = (_strings(request, "guided_decoding_guide_type") or [None])[0]
        guide = guided_decoding(guide_type, (_strings(request, "guided_decoding_guide") or [""])[0],
                                self.GuidedDecodingParams)
        if guide is not None:
            kwargs["guided_decoding"] = guide
        streaming = bool(_scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise ValueError("Streaming is only supported in decoupled mode.")
        if kwargs.get("n", 1) > 1 and not self.decoupled:
            raise ValueError("sampling_param_n > 1 needs decoupled mode (one response per completion)")
        if streaming and kwargs.get("best_of", kwargs.get("n", 1)) > kwargs.get("n", 1):
            raise ValueError("best_of greater than n cannot be streamed; send streaming false")
        return prompt, self.SamplingParams(**kwargs), streaming

    def _text(self, values):
        return [pb_utils.Tensor("text_output", np.array(values, dtype=np.object_))]

    def _responses(self, request, output, diff: bool, reported: set[int]) -> list:
        """The responses for ``output``: one with every completion's text (upstream's form), or with
        ``sampling_param_n`` one per completion that changed, each carrying its ``sequence_index``."""
        if _scalar(request, "sampling_param_n") is None:
            return [self._response(request, output, output.outputs, diff, reported)]
        changed = [c for c in output.outputs if not diff or (c.token_ids_diff or c.text_diff)
                   or (c.finish_reason is not None and c.index not in reported)]
        return [self._response(request, output, [c], diff, reported, index=True) for c in changed]

    def _response(self, request, output, completions, diff: bool, reported: set[int], index: bool = False):
        first = completions[0]
        is_first = not diff or len(first.token_ids_diff) == len(first.token_ids)  # its first response
        texts = [c.text_diff if diff else c.text for c in completions]
        tensors = self._text(texts)
        tokens = list(first.token_ids_diff if diff else first.token_ids)
        tensors.append(pb_utils.Tensor("output_ids", np.array(tokens, dtype=np.int32)))
        tensors.append(pb_utils.Tensor("num_input_tokens", np.array([len(output.prompt_token_ids)], np.int32)))
        tensors.append(pb_utils.Tensor("num_output_tokens", np.array([len(first.token_ids)], np.int32)))
        if index:
            tensors.append(pb_utils.Tensor("sequence_index", np.array([first.index], np.int32)))
        reported.update(c.index for c in completions if c.finish_reason is not None)
        for flag, name in (("return_finish_reason", "finish_reason"), ("return_stop_reason", "stop_reason")):
            if bool(_scalar(request, flag, False)):
                values = [str(getattr(c, name)) for c in completions]
                tensors.append(pb_utils.Tensor(name, np.array(values, dtype=np.object_)))
        if bool(_scalar(request, "return_cumulative_logprob", False)):
            logprobs = [float(c.cumulative_logprob or 0.0) for c in completions]
            tensors.append(pb_utils.Tensor("cumulative_logprob", np.array(logprobs, dtype=np.float32)))
        if getattr(first, "disaggregated_params", None) is not None:
            wire = disaggregated_wire(first.disaggregated_params)
            tensors.append(pb_utils.Tensor("disaggregated_params", np.array([wire], dtype=np.object_)))
        num_top = _scalar(request, "sampling_param_logprobs")
        if num_top is not None:
            entries = list(first.logprobs_diff if diff else first.logprobs)
            tensors += logprob_tensors("output_", entries, tokens, int(num_top))
        num_prompt_top = _scalar(request, "sampling_param_prompt_logprobs")
        if num_prompt_top is not None and is_first:
            prompt, entries = list(output.prompt_token_ids), list(first.prompt_logprobs or [])
            entries = [None] * (len(prompt) - len(entries)) + entries  # aligned on the last prompt token
            tensors += logprob_tensors("prompt_", entries, prompt, int(num_prompt_top))
        return pb_utils.InferenceResponse(tensors)

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
                    latest = stats[-1] if isinstance(stats[-1], dict) else {}
                    for path, metric in self.gauges:
                        value: Any = latest
                        for key in path:
                            value = value.get(key, 0) if isinstance(value, dict) else 0
                        metric.set(float(value or 0))
            except Exception as exc:  # statistics are best effort; serving goes on
                pb_utils.Logger.log_warn(f"llmapi gauges: {exc!r}")
            await asyncio.sleep(0.5)
