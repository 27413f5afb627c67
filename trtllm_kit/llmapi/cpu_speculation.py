"""The CPU ``LLM``'s ``speculative_config``, run for real: ``NGram`` (prompt lookup) and ``DraftTarget`` (the draft
checkpoint at ``speculative_model_dir``, 1.3's ``speculative_model``, loaded unsharded) with ``max_draft_len``;
the other decoding types are refused in one sentence."""

from __future__ import annotations

from collections.abc import Mapping as MappingType
from pathlib import Path
from typing import Any

from trtllm_kit.llmapi.load import load_checkpoint
from trtllm_kit.mapping import Mapping
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.draft_model import DraftModel, draft_config
from trtllm_kit.runtime.prompt_lookup import DEFAULT_MAX_NGRAM, PromptLookup
from trtllm_kit.runtime.speculation import Speculator
from trtllm_kit.spec.speculative import DEFAULT_MAX_DRAFT_LEN, Speculation
from trtllm_kit.spec.speculative_support import DECODING_TYPES, MODEL_DIR_KEY

NGRAM_KEY = "max_matching_ngram_size"  # NGramDecodingConfig's longest matched suffix


def speculator_of(speculative_config: MappingType[str, Any] | None, config: EngineConfig,
                  vocab_size: int) -> Speculator | None:
    """The runtime's speculator for the LLM's ``speculative_config`` (None without one); ``ValueError`` for a
    decoding type the CPU runtime does not run or a draft directory that is missing.

    Arguments:
        speculative_config: the LLM argument, as ``model.yaml`` or the options file carries it;
        config: the target engine's settings; vocab_size: the target's vocabulary.
    """
    if not speculative_config:
        return None
    decoding_type = speculative_config.get("decoding_type")
    draft_len = int(speculative_config.get("max_draft_len") or DEFAULT_MAX_DRAFT_LEN)
    if draft_len < 1:
        raise ValueError(f"speculative_config max_draft_len is {draft_len}; use at least 1")
    if decoding_type in DECODING_TYPES[Speculation.NGRAM]:
        return Speculator(PromptLookup(int(speculative_config.get(NGRAM_KEY) or DEFAULT_MAX_NGRAM)), draft_len)
    if decoding_type in DECODING_TYPES[Speculation.DRAFT_TARGET]:
        draft_dir = next((speculative_config[k] for k in MODEL_DIR_KEY.values() if speculative_config.get(k)), None)
        if draft_dir is None or not Path(draft_dir).is_dir():
            raise ValueError(f"speculative_config {MODEL_DIR_KEY[(1, 2)]} is {draft_dir!r}, not a directory; point "
                             "it at the draft checkpoint")
        draft = DraftModel(load_checkpoint(Path(draft_dir), Mapping(1, 1)), draft_config(config, draft_len),
                           vocab_size)
        return Speculator(draft, draft_len)
    runnable = ", ".join(DECODING_TYPES[s][0] for s in (Speculation.NGRAM, Speculation.DRAFT_TARGET))
    raise ValueError(f"speculative_config decoding_type {decoding_type!r} does not run on the CPU runtime; use "
                     f"one of {runnable}")
