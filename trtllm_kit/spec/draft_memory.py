"""What speculation adds to a memory plan: the verify step's draft tokens and, for draft-target, the draft model's
weights and KV cache (the draft is whole on every rank, at the precision its target builds it in, as many times as
the served build loads it: ``speculative_support.DRAFT_COPIES``); for Medusa, the
heads' weights on each rank (split as the target's linears, in its dtype, unquantized; no KV cache); for EAGLE-1,
the EagleNets' weights and their decoder layer's KV cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtllm_kit.build_limits import DraftMemory
from trtllm_kit.enums import Target
from trtllm_kit.models.hf_config import parse_hf_config, read_hf_config
from trtllm_kit.plan import kv_bytes_per_token
from trtllm_kit.precision import ITEMSIZE, Precision
from trtllm_kit.spec.eagle_heads import EagleHeads
from trtllm_kit.spec.heads import rank_numel
from trtllm_kit.spec.heads_reader import read_heads
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions
from trtllm_kit.spec.speculative_support import DRAFT_COPIES, mtp_layers


def draft_memory(options: SpeculativeOptions, hf_config: Mapping[str, Any], precision: Precision, tp_size: int = 1,
                 target: Target | None = None) -> DraftMemory | None:
    """The plan's ``Limits.draft`` for a ``[speculative]`` table (None without speculation).

    Arguments:
        options: the table; hf_config: the target's ``config.json`` (MTP's layers, Medusa's sizes); precision: the
        draft's (the engine target builds it unquantized in the target's dtype; the llmapi target at the target's
        precision); tp_size: the target's tensor-parallel size (Medusa's heads are split as its linears).
    """
    if options.mode is None:
        return None
    if options.mode is Speculation.MTP:
        return DraftMemory(mtp_layers(options, hf_config))
    heads = read_heads(options, parse_hf_config(dict(hf_config), "the model's config.json"))
    if heads is not None:
        kv = heads.kv_bytes_per_token(precision.kv_bytes) if isinstance(heads, EagleHeads) else 0
        return DraftMemory(options.draft_len, rank_numel(heads, tp_size) * ITEMSIZE[precision.dtype], kv)
    if options.mode is not Speculation.DRAFT_TARGET or options.draft_model is None:
        return DraftMemory(options.draft_len)
    draft = read_hf_config(options.draft_model)
    copies = DRAFT_COPIES.get(target, 1) if target is not None else 1
    return DraftMemory(options.draft_len, copies * draft.num_parameters * ITEMSIZE[precision.dtype],
                       copies * kv_bytes_per_token(draft.num_hidden_layers, draft.num_key_value_heads, draft.head_dim,
                                                   precision.kv_bytes))
