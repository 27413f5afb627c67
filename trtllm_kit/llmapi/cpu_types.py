"""The request and result types of the kit's CPU ``LLM`` class, with ``tensorrt_llm``'s field names and defaults
(``SamplingParams``, ``GuidedDecodingParams``, ``LoRARequest``, ``CompletionOutput``, ``Logprob``), and their
translation to the CPU runtime's settings and back.

Logprobs are the raw model distribution's (``trtllm_kit/runtime/logprobs.py``): ``logprobs`` N gives, per
generated token, a dict of the N most likely tokens plus the sampled one, each a ``Logprob(logprob, rank)``;
``prompt_logprobs`` N the same per prompt token, the first one None (no token precedes it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from trtllm_kit.runtime.sequence import TokenLogprob
from trtllm_kit.wire import DraftAcceptance


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability and its rank (1 = the most likely)."""

    logprob: float
    rank: int | None = None


TokenLogprobs = list[dict[int, Logprob]]


@dataclass
class GuidedDecodingParams:
    """What the output must match: exactly one of a JSON schema (``json``, a string or dict), ``regex``, an EBNF
    ``grammar``, or ``json_object`` (any JSON object). ``structural_tag`` is accepted and refused at use."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        chosen = [name for name in ("json", "regex", "grammar", "json_object", "structural_tag") if getattr(self, name)]
        if len(chosen) > 1:
            raise ValueError(f"only one guide may be set in GuidedDecodingParams, got {', '.join(chosen)}")

    def guide(self) -> tuple[str, str] | None:
        """(guide type, text) as ``trtllm_kit.runtime.grammar.Guide`` takes them; None when nothing is set."""
        if self.structural_tag:
            raise ValueError("structural_tag guided decoding is not supported by the CPU runtime; use json, regex "
                             "or grammar")
        if self.json is not None:
            return "json_schema", self.json if isinstance(self.json, str) else json.dumps(self.json)
        if self.regex is not None:
            return "regex", self.regex
        if self.grammar is not None:
            return "ebnf_grammar", self.grammar
        return ("json", "") if self.json_object else None


@dataclass
class SamplingParams:
    """The ``tensorrt_llm.SamplingParams`` fields the llmapi model sets (``None``: the library default)."""

    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    include_stop_str_in_output: bool = False  # the CPU runtime keeps a matched stop in the output either way
    min_tokens: int | None = None
    end_id: int | None = None
    ignore_eos: bool = False
    n: int = 1
    best_of: int | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    guided_decoding: GuidedDecodingParams | None = None
    exclude_input_from_output: bool = True
    return_perf_metrics: bool = False
    # the kit's (tensorrt_llm has no such field): the token that ends the sequence is the last of ``token_ids``,
    # with its logprob, as vLLM and OpenAI answer (runtime ``SamplingParams.keep_end_token``)
    keep_end_token: bool = False


@dataclass(frozen=True)
class LoRARequest:
    """A request's adapter, as ``tensorrt_llm``'s ``LoRARequest``: its name, its id (the adapter cache's key: one id
    names one adapter) and the PEFT directory on this machine."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if not os.path.isdir(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")
        if self.lora_ckpt_source != "hf":
            raise ValueError(f"lora_ckpt_source {self.lora_ckpt_source!r} is not supported by the CPU runtime; "
                             "use hf (a PEFT directory)")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


@dataclass
class CompletionOutput:
    """One generated sequence, as ``tensorrt_llm``'s ``CompletionOutput`` reports it."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    logprobs: TokenLogprobs = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)
    generation_logits: Any = None  # torch.Tensor [tokens, vocab] with return_generation_logits
    disaggregated_params: Any = None  # a context-only request's DisaggregatedParams, once finished
    # the CPU runtime's own (TensorRT-LLM's CompletionOutput has no such field): what speculation drafted and kept
    draft_acceptance: DraftAcceptance | None = None
    text_diff: str = ""
    token_ids_diff: list[int] = field(default_factory=list)
    logprobs_diff: TokenLogprobs = field(default_factory=list)


def logprob_dict(entry: TokenLogprob | None) -> dict[int, Logprob] | None:
    """The LLM API's form of one position: the top alternatives and the scored token, by id.

    Arguments:
        entry: the runtime's record of the position (None: the first prompt token).
    """
    if entry is None:
        return None
    scored = {top_id: Logprob(value, rank) for rank, (top_id, value) in
              enumerate(zip(entry.top_ids, entry.top_logprobs, strict=True), start=1)}
    scored.setdefault(entry.token_id, Logprob(entry.logprob, entry.rank))
    return scored
