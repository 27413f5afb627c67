"""The speculative heads a build writes into its checkpoint, read and checked against the base by mode (Medusa:
``spec.medusa_heads``, EAGLE-1: ``spec.eagle_heads``); the precision they need."""

from __future__ import annotations

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.precision import Precision
from trtllm_kit.spec.eagle_heads import read_eagle_heads
from trtllm_kit.spec.heads import SpeculativeHeads
from trtllm_kit.spec.medusa_heads import check_tree_depth, read_medusa_heads
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions

HEADS_MODES = (Speculation.MEDUSA, Speculation.EAGLE)  # the modes whose --draft-model is heads on the target


def read_heads(options: SpeculativeOptions, base: HFConfig) -> SpeculativeHeads | None:
    """The checked heads of a Medusa or EAGLE build (None for other modes, or without a heads directory: that
    refusal is ``speculative_support.check_build``'s).

    Arguments:
        options: the ``[speculative]`` table; base: the target model's config.
    """
    heads_dir = options.draft_model
    if options.mode not in HEADS_MODES or heads_dir is None or not heads_dir.is_dir():
        return None
    if options.mode is Speculation.EAGLE:
        return read_eagle_heads(heads_dir, base, options.tree)
    medusa = read_medusa_heads(heads_dir, base)
    check_tree_depth(medusa, options, heads_dir)
    return medusa


def check_heads_precision(options: SpeculativeOptions, precision: Precision) -> None:
    """Refuse quantized weights under heads: the kit writes the heads unquantized, and a quantized Medusa or EAGLE
    model would quantize their linears too.

    Arguments:
        options: the ``[speculative]`` table; precision: the target's checkpoint precision.
    """
    if options.mode in HEADS_MODES and precision.quant_algo is not None:
        raise KitUsageError(f"--speculative {options.mode} builds the heads unquantized, but the weights' quant_algo "
                            f"is {precision.quant_algo}; build with --quant none (--kv-cache may stay quantized).")
