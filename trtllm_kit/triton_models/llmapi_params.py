"""The LLM API's arguments of a wire request: ``SamplingParams`` fields, the guide, and the checks the LLM API
leaves to its caller (the disaggregation parameters come from ``llmapi/disaggregated_params.py``).

A row's ``SamplingParams`` field is its llmapi tensor without ``sampling_param_`` (upstream's rule), so
``sampling_param_stop`` is ``stop`` and ``sampling_param_exclude_input_from_output`` is
``exclude_input_from_output``; an ``end_id`` of -1 (no end token) is the LLM API's ``ignore_eos``. Rows whose
tensor has no such prefix (``streaming``, ``priority``, the ``return_*`` flags, ``keep_end_token``) are the
model's to read.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from trtllm_kit.wire import GenerationRequest, WireError
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.llmapi import IGNORE_EOS
from trtllm_kit.wire.request import NEVER_END_ID, greedy_settings

PREFIX = "sampling_param_"
# guided_decoding_guide_type → GuidedDecodingParams field (choice becomes an EBNF grammar)
GUIDES = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar",
          "choice": "grammar"}
# Exceptions that mean the request, not the server, is wrong (tensorrt_llm's and the kit's): answered INVALID_ARG
CLIENT_ERRORS = ("ValueError", "RequestError", "KitUsageError", "ModelError")
SAMPLING_FIELDS = {  # record field → SamplingParams field, by upstream's rule
    row.name: names[0].removeprefix(PREFIX) for row in rows(GenerationRequest)
    if len(names := row.tensors("llmapi")) == 1 and names[0].startswith(PREFIX)}
# SamplingParams field → the narrower rule the LLM API leaves to its caller (its row's ``llmapi_rule``)
CALLER_RULES = {SAMPLING_FIELDS[row.name]: rule for row in rows(GenerationRequest) if (rule := row.wire.llmapi_rule)}


def sampling_kwargs(req: GenerationRequest) -> dict[str, Any]:
    """``SamplingParams`` keywords of the fields ``req`` sets, checked as the LLM API leaves to its caller.

    Arguments:
        req: the decoded request.
    """
    kwargs: dict[str, Any] = {}
    for name, field in SAMPLING_FIELDS.items():
        value = getattr(req, name)
        if value not in (None, ()):
            kwargs[field] = list(value) if isinstance(value, tuple) else value
    if req.end_id == NEVER_END_ID:
        del kwargs[SAMPLING_FIELDS["end_id"]]
        kwargs[IGNORE_EOS.removeprefix(PREFIX)] = True
    check_sampling(kwargs)
    return kwargs


def sampling_params(req: GenerationRequest, sampling_class: Any, guide_class: Any) -> Any:
    """The request's ``SamplingParams``: its fields, its guide, and the kit's ``keep_end_token`` where the class has
    that field (the kit's CPU one; TensorRT-LLM's has none, and there it is not sent).

    Arguments:
        req: the decoded request; sampling_class: ``SamplingParams``; guide_class: ``GuidedDecodingParams``.
    """
    kwargs = sampling_kwargs(req)
    if req.keep_end_token and "keep_end_token" in inspect.signature(sampling_class).parameters:
        kwargs["keep_end_token"] = True
    guide = guided_decoding(req.guide, guide_class)
    if guide is not None:
        kwargs["guided_decoding"] = guide
    return sampling_class(**kwargs)


def check_sampling(kwargs: dict[str, Any]) -> None:
    """Refuse a value outside the bounds the LLM API leaves to its caller (``CALLER_RULES``); say a greedy
    temperature as the wire's ``greedy_settings`` says it, before either reaches the engine.

    Arguments:
        kwargs: ``SamplingParams`` keywords, changed in place.
    """
    for name, rule in CALLER_RULES.items():
        value = kwargs.get(name)
        if value is None:
            continue
        try:
            rule.checked(name, value)
        except WireError:
            raise ValueError(f"{name} must be in {rule.interval}, got {value!r}") from None
    greedy_settings(kwargs)


def check_mode(req: GenerationRequest, decoupled: bool) -> None:
    """Refuse what the model's transaction policy cannot answer: streaming, or several completions, without
    decoupled mode; a streamed ``best_of`` larger than ``n``.

    Arguments:
        req: the decoded request; decoupled: the model's policy.
    """
    if req.streaming and not decoupled:
        raise ValueError("Streaming is only supported in decoupled mode.")
    if (req.n or 1) > 1 and not decoupled:
        raise ValueError("sampling_param_n > 1 needs decoupled mode (one response per completion)")
    if req.streaming and req.num_sequences > (req.n or 1):
        raise ValueError("best_of greater than n cannot be streamed; send streaming false")


def guided_decoding(guide: tuple[str, str] | None, params_class: Any) -> Any:
    """``GuidedDecodingParams`` of the request's guide (None without one); a choice list becomes an EBNF grammar of
    its strings.

    Arguments:
        guide: (``guided_decoding_guide_type``, ``guided_decoding_guide``); params_class: the class.
    """
    if guide is None:
        return None
    guide_type, text = guide
    if guide_type == "json":
        return params_class(json_object=True)
    if guide_type == "choice":
        choices = json.loads(text) if text.startswith("[") else None
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError(f"a choice guide must be a JSON array of strings, got {text[:80]!r}")
        text = "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    return params_class(**{GUIDES[guide_type]: text})


def is_client_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the request, not the server, is wrong (answered INVALID_ARG).

    Arguments:
        exc: what the request raised.
    """
    return any(cls.__name__ in CLIENT_ERRORS for cls in type(exc).__mro__)
