"""Dynamo's ``PreprocessedRequest`` (token ids in) as the kit's CPU ``LLM`` request, and its chunks back.

The frontend tokenizes, applies the chat template, matches stop strings and hidden stop tokens and detokenizes;
the worker generates token ids, and with ``output_options.logprobs`` N each token's logprob and its N best
alternatives (``log_probs`` and ``top_logprobs``, which the frontend turns into OpenAI's; it adds the token itself
to a position's alternatives when they do not hold it). A scored answer ends with its end token and that token's
logprob, as a plain serve's does (``keep_end_token``); the frontend keeps it in the logprobs, not in the text.
The frontend takes N up to 5 (OpenAI's completions bound); the kit's frontend asks for more (chat's
``top_logprobs`` go to 20) in the annotation ``LOGPROBS_ANNOTATION`` N, which the worker reads before
``output_options.logprobs``. The prompt's logprobs (echo with logprobs), which Dynamo's frontend has no field for,
are asked in the annotation ``PROMPT_LOGPROBS_ANNOTATION`` N and come back in the first chunk's ``engine_data``
(``PROMPT_SCORED``: per prompt token its id, logprob and alternatives, the first with none), which the frontend
passes on as ``nvext.engine_data``. A field the CPU runtime cannot honour is refused in one sentence
(``DynamoRequestError``), never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.cpu_llm import GuidedDecodingParams, SamplingParams
from trtllm_kit.serve.dynamo.logprobs import LOGPROBS_ANNOTATION, PROMPT_LOGPROBS_ANNOTATION, PROMPT_SCORED
from trtllm_kit.triton_models.llmapi_outputs import scored_of
from trtllm_kit.triton_models.llmapi_params import SAMPLING_FIELDS
from trtllm_kit.wire import GenerationRequest, Scored
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.request import MAX_LOGPROBS

# sampling_options keys are the wire's field names, which SAMPLING_FIELDS maps onto SamplingParams; the one rename:
GUIDED_DECODING = "guided_decoding"  # the wire's guide, mapped by _guide
PARAMS = {**SAMPLING_FIELDS, "guide": GUIDED_DECODING}  # wire field → SamplingParams field
BEAMS = ("use_beam_search", *(row.name for row in rows(GenerationRequest) if row.wire.beams))  # refused when set
# guided_decoding fields and their GuidedDecodingParams names
GUIDE_FIELDS = {"json": "json", "regex": "regex", "grammar": "grammar"}


class DynamoRequestError(KitUsageError):
    """A request field the CPU runtime cannot honour (the frontend answers 400)."""


@dataclass(frozen=True)
class WorkerRequest:
    """One request for the CPU ``LLM``: the prompt's token ids and the sampling settings."""

    token_ids: list[int]
    sampling: SamplingParams


def worker_request(request: dict[str, Any], max_seq_len: int) -> WorkerRequest:
    """The CPU ``LLM``'s request for Dynamo's ``PreprocessedRequest``; refuses what it cannot honour.

    Arguments:
        request: the request as the frontend sends it (``token_ids``, ``stop_conditions``, ``sampling_options``,
        ``output_options``, ``eos_token_ids``, ...); max_seq_len: the artifact's prompt + output bound (a request
        without ``max_tokens`` generates up to it).
    """
    token_ids = [int(t) for t in request.get("token_ids") or []]
    if not token_ids:
        raise DynamoRequestError("token_ids is empty; send a prompt of at least one token.")
    stop = dict(request.get("stop_conditions") or {})
    sampling = dict(request.get("sampling_options") or {})
    output = dict(request.get("output_options") or {})
    _refuse_set(stop, "stop_conditions", ("max_thinking_tokens",), "the CPU runtime has no thinking budget")
    _refuse_set(sampling, "sampling_options", BEAMS, "serve --dynamo decodes without beams")
    _refuse_set(output, "output_options", ("prompt_logprobs",),
                "Dynamo's frontend returns no prompt logprobs; ask serve --dynamo's OpenAI port for echo with logprobs")
    for name in ("n", "best_of"):
        if sampling.get(name) not in (None, 1):
            raise DynamoRequestError(f"sampling_options.{name} is {sampling[name]}; serve --dynamo answers one "
                                     "choice per request: send n=1 and no best_of.")
    max_tokens = stop.get("max_tokens")
    room = max_seq_len - len(token_ids)
    if room < 1:
        raise DynamoRequestError(f"the prompt has {len(token_ids)} tokens and max_seq_len is {max_seq_len}; "
                                 "shorten the prompt.")
    eos_ids = [int(t) for t in request.get("eos_token_ids") or []]
    annotations = request.get("annotations") or []
    num_top = _annotated(annotations, LOGPROBS_ANNOTATION)
    num_top = num_top if num_top is not None or output.get("logprobs") is None else int(output["logprobs"])
    params = SamplingParams(
        max_tokens=room if max_tokens is None else int(max_tokens),
        ignore_eos=bool(stop.get("ignore_eos")), end_id=eos_ids[0] if eos_ids else None, logprobs=num_top,
        keep_end_token=num_top is not None, prompt_logprobs=_annotated(annotations, PROMPT_LOGPROBS_ANNOTATION),
        guided_decoding=_guide(sampling.get(GUIDED_DECODING)), **_sampling_fields(sampling), **_stop_fields(stop))
    return WorkerRequest(token_ids=token_ids, sampling=params)


def _sampling_fields(sampling: dict[str, Any]) -> dict[str, Any]:
    """``SamplingParams`` keywords of the ``sampling_options`` set, by the wire's field names; refuses the rest."""
    kwargs: dict[str, Any] = {}
    for name, value in sampling.items():
        if value is None or value is False or name == GUIDED_DECODING:  # False: a flag left off
            continue
        if name not in SAMPLING_FIELDS:
            raise DynamoRequestError(f"sampling_options.{name} is {value!r}; the CPU runtime has no such setting: "
                                     "leave it out.")
        kwargs[SAMPLING_FIELDS[name]] = value
    return kwargs


def _stop_fields(stop: dict[str, Any]) -> dict[str, Any]:
    """``SamplingParams`` keywords of the ``stop_conditions`` set that the wire also declares (its minimum
    length); ``max_tokens`` is the caller's."""
    return {SAMPLING_FIELDS[name]: value for name, value in stop.items()
            if name in SAMPLING_FIELDS and name != "max_tokens" and value is not None}


def _annotated(annotations: list[str], prefix: str) -> int | None:
    """The alternatives per token the kit's annotation ``prefix`` N asks for (None: not sent)."""
    for annotation in annotations:
        if annotation.startswith(prefix):
            value = annotation.removeprefix(prefix)
            if not value.isdigit() or int(value) > MAX_LOGPROBS:
                raise DynamoRequestError(f"the annotation {annotation!r} asks for {value!r} alternatives per token; "
                                         f"send {prefix}N with N from 0 to {MAX_LOGPROBS}.")
            return int(value)
    return None


def prompt_scored(entries: list[Any] | None, token_ids: list[int], num_top: int) -> tuple[Scored, ...]:
    """The prompt's scored tokens from the CPU ``LLM``'s ``prompt_logprobs`` (aligned on the last prompt token).

    Arguments:
        entries: a ``{token_id: Logprob}`` dict (or None) per scored prompt position; token_ids: the prompt;
        num_top: alternatives per position.
    """
    found = list(entries or [])
    return scored_of([None] * (len(token_ids) - len(found)) + found, token_ids, num_top)


def _refuse_set(values: dict[str, Any], where: str, names: tuple[str, ...], why: str) -> None:
    for name in names:
        if values.get(name) not in (None, False):
            raise DynamoRequestError(f"{where}.{name} is {values[name]!r}; {why}.")


def _guide(guided: dict[str, Any] | None) -> GuidedDecodingParams | None:
    if not guided:
        return None
    chosen = {name: value for name, value in guided.items() if value not in (None, "", [])}
    unknown = sorted(set(chosen) - set(GUIDE_FIELDS) - {"backend"})
    if unknown:
        raise DynamoRequestError(f"sampling_options.guided_decoding.{unknown[0]} is set; the CPU runtime guides by "
                                 "json, regex or grammar only.")
    if chosen.get("backend") not in (None, "xgrammar"):
        raise DynamoRequestError(f"sampling_options.guided_decoding.backend is {chosen['backend']!r}; the CPU "
                                 "runtime guides with xgrammar.")
    return GuidedDecodingParams(**{GUIDE_FIELDS[name]: value for name, value in chosen.items() if name != "backend"})


def response_chunk(token_ids: list[int], finish_reason: str | None, num_prompt_tokens: int,
                   num_output_tokens: int, scored: tuple[Scored, ...] | None = None,
                   prompt: tuple[Scored, ...] | None = None) -> dict[str, Any]:
    """One response chunk as the frontend reads it: the new token ids (and their logprobs when asked for); the last
    adds the finish reason and usage.

    Arguments:
        token_ids: the tokens generated since the previous chunk; finish_reason: ``stop``, ``length`` or
        ``cancelled`` on the last chunk (None before); num_prompt_tokens, num_output_tokens: the usage so far;
        scored: the new tokens' logprobs and alternatives, best first (None: not asked for); prompt: the prompt's
        (the first chunk's, when asked for).
    """
    chunk: dict[str, Any] = {"token_ids": token_ids, "index": 0}
    if prompt is not None:
        chunk["engine_data"] = {PROMPT_SCORED: [[token_id, logprob, [list(pair) for pair in alternatives]]
                                                for token_id, logprob, alternatives in prompt]}
    if scored is not None:
        chunk["log_probs"] = [0.0 if logprob is None else logprob for _, logprob, _ in scored]  # never None here
        chunk["top_logprobs"] = [[{"rank": rank, "token_id": token_id, "token": None, "logprob": logprob}
                                  for rank, (token_id, logprob) in enumerate(alternatives, start=1)]
                                 for _, _, alternatives in scored]
    if finish_reason is not None:
        chunk["finish_reason"] = finish_reason
        chunk["completion_usage"] = {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
                                     "total_tokens": num_prompt_tokens + num_output_tokens}
    return chunk
