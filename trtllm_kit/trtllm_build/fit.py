"""Refusing a plan that does not fit, with its numbers and the nearest settings that do."""

from __future__ import annotations

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.plan import BuildPlan, RankPlan, gib, with_changes

MAX_SUGGESTIONS = 3


def check_plan(plan: BuildPlan, hf: HFConfig, family: Family) -> None:
    """Raise ``KitUsageError`` naming the tightest rank's figures and up to three settings that fit.

    Arguments:
        plan: from ``make_plan``; hf: the model config; family: its weight table.
    """
    if plan.fits:
        return
    rank = min(plan.ranks, key=lambda r: (r.free_bytes > 0, r.max_sequences))
    head = f"the build does not fit on {plan.gpu.name} ({gib(plan.gpu.memory_bytes)} per GPU): "
    if rank.free_bytes <= 0:
        why = (f"rank {rank.rank} needs {gib(rank.weight_bytes)} of weights + {gib(rank.activation_bytes)} of "
               f"activations + {gib(rank.buffer_bytes)} of buffers, {gib(-rank.free_bytes)} more than the GPU has")
    else:
        why = (f"rank {rank.rank} has {gib(rank.free_bytes)} left after weights, activations and buffers; "
               f"{plan.kv_cache_fraction:g} of it holds {rank.num_blocks} KV blocks of {plan.tokens_per_block} "
               f"tokens ({gib(rank.block_bytes * rank.num_blocks)}), {rank.max_sequences} sequence(s) of "
               f"{plan.max_seq_len} tokens, fewer than max_batch_size {max(1, plan.max_batch_size)}")
    fits = suggestions(plan, rank, hf, family)
    tail = f"; settings that fit: {', '.join(fits)}." if fits else "; no nearby setting fits: use a larger GPU."
    raise KitUsageError(head + why + tail)


def suggestions(plan: BuildPlan, rank: RankPlan, hf: HFConfig, family: Family) -> list[str]:
    """Up to ``MAX_SUGGESTIONS`` single changes after which the plan fits, nearest first.

    Arguments:
        plan: the plan that does not fit; rank: its tightest rank; hf: model config; family: weight table.
    """
    candidates: list[tuple[str, dict[str, object]]] = []
    if rank.free_bytes > 0:
        if "max_batch_size" not in plan.derived and rank.max_sequences >= 1:
            candidates.append((f"--max-batch-size {rank.max_sequences}", {"max_batch_size": rank.max_sequences}))
        blocks_each = rank.num_blocks // max(1, plan.max_batch_size)
        if blocks_each >= 1:
            seq_len = blocks_each * plan.tokens_per_block
            changes: dict[str, object] = {"max_seq_len": seq_len}
            if plan.max_input_len > seq_len - 1:
                changes["max_input_len"] = max(1, seq_len // 2)
            candidates.append((f"--max-seq-len {seq_len}", changes))
    if plan.precision.kv_cache_quant_algo is None and plan.precision.quant_algo in (None, "FP8"):
        kv = "FP8" if plan.gpu.has_fp8 else "INT8"
        if plan.precision.quant_algo is None or kv == "FP8":
            candidates.append((f"--kv-cache {kv.lower()}", {"kv_cache_quant_algo": kv}))
    if rank.free_bytes <= 0 and plan.precision.quant_algo is None:
        candidates.append(("--quant fp8", {"quant_algo": "FP8"}) if plan.gpu.has_fp8 else
                          ("--quant int8-wo", {"quant_algo": "W8A16"}))
    for factor in (2, 4, 8):
        candidates.append((f"--tp {plan.tp_size * factor}", {"tp": plan.tp_size * factor}))
    found = []
    for flag, changes in candidates:
        other = with_changes(plan, hf, family, **changes)
        if other is not None and other.fits:
            found.append(f"{flag} ({other.max_sequences} sequence(s) of {other.max_seq_len} tokens)")
            if flag.startswith("--tp"):
                break  # the smallest tp that fits is the nearest
        if len(found) == MAX_SUGGESTIONS:
            break
    return found
