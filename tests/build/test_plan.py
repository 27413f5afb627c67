"""The memory planner against hand computations from the formulas of docs/trtllm-checkpoint.md §8, on real
configs and H100-80GB.

Every expected figure below is written out from the formulas (numbers of the published configs), not
computed by the planner's code: weights per rank = Σ numel × 2 bytes over the rank's tensors (+ 4 bytes per
layer for a quantized KV cache's scale), KV/token = 2·L_r·Nkv_r·d·b_kv, block = 32 tokens, activations =
8·max_num_tokens·max(H, I/tp)·2, buffers = max_batch_size·pad(V, tp)·4, left = M − the three, pool =
⌊0.9·left⌋, blocks = ⌊pool/block⌋, sequences = ⌊blocks/⌈8192/32⌉⌋.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trtllm_kit.build_limits import Limits
from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GIB, GPU_TABLE, MIB, gpu_from_table, resolve_gpu
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig, read_hf_config
from trtllm_kit.models.registry import family_for
from trtllm_kit.plan import make_plan, rank_weight_bytes
from trtllm_kit.precision import Precision
from trtllm_kit.trtllm_build.fit import check_plan

CONFIGS = Path(__file__).parents[1] / "data" / "hf-configs"
LLAMA3_8B, LLAMA3_70B = "meta-llama--Meta-Llama-3-8B", "meta-llama--Meta-Llama-3-70B"
H100 = 81559 * MIB  # nvidia-smi memory.total of an H100 80GB HBM3
LIMITS = Limits(max_batch_size=64, max_seq_len=8192, max_num_tokens=8192, tokens_per_block=32, kv_cache_fraction=0.9)

# Llama-3-8B: V 128256, H 4096, L 32, Nq 32, Nkv 8, d 128, I 14336
W8B_TP1 = 2 * (128256 * 4096 * 2 + 4096 + 32 * (2 * 4096 + 6144 * 4096 + 4096 * 4096 + 3 * 14336 * 4096))
W8B_TP2 = 2 * (128256 * 4096 + 64128 * 4096 + 4096 + 32 * (2 * 4096 + 3072 * 4096 + 4096 * 2048 + 3 * 7168 * 4096))
# Llama-3-70B: V 128256, H 8192, L 80, Nq 64, Nkv 8, d 128, I 28672
W70B_TP4 = 2 * (128256 * 8192 + 32064 * 8192 + 8192 + 80 * (2 * 8192 + 2560 * 8192 + 8192 * 2048 + 3 * 7168 * 8192))
W70B_TP8 = 2 * (128256 * 8192 + 16032 * 8192 + 8192 + 80 * (2 * 8192 + 1280 * 8192 + 8192 * 1024 + 3 * 3584 * 8192))

# model, tp, KV dtype → weights/rank, KV bytes/token/rank, block, activations, buffers, left, pool, blocks, sequences
TABLE = [
    (LLAMA3_8B, 1, None, W8B_TP1, 2 * 32 * 8 * 128 * 2, 4 * MIB, 8 * 8192 * 14336 * 2, 64 * 128256 * 4,
     67548405760, 60793565184, 14494, 56),
    (LLAMA3_8B, 1, "FP8", W8B_TP1 + 32 * 4, 2 * 32 * 8 * 128 * 1, 2 * MIB, 8 * 8192 * 14336 * 2, 64 * 128256 * 4,
     67548405632, 60793565068, 28988, 113),
    (LLAMA3_8B, 2, None, W8B_TP2, 2 * 32 * 4 * 128 * 2, 2 * MIB, 8 * 8192 * 7168 * 2, 64 * 128256 * 4,
     75992588288, 68393329459, 32612, 127),
    (LLAMA3_8B, 2, "FP8", W8B_TP2 + 32 * 4, 2 * 32 * 4 * 128 * 1, 1 * MIB, 8 * 8192 * 7168 * 2, 64 * 128256 * 4,
     75992588160, 68393329344, 65224, 254),
    (LLAMA3_70B, 4, None, W70B_TP4, 2 * 80 * 2 * 128 * 2, 2.5 * MIB, 8 * 8192 * 8192 * 2, 64 * 128256 * 4,
     47559393280, 42803453952, 16328, 63),
    (LLAMA3_70B, 4, "FP8", W70B_TP4 + 80 * 4, 2 * 80 * 2 * 128 * 1, 1.25 * MIB, 8 * 8192 * 8192 * 2, 64 * 128256 * 4,
     47559392960, 42803453664, 32656, 127),
    (LLAMA3_70B, 8, None, W70B_TP8, 2 * 80 * 1 * 128 * 2, 1.25 * MIB, 8 * 8192 * 8192 * 2, 64 * 128256 * 4,
     64934821888, 58441339699, 44587, 174),
    (LLAMA3_70B, 8, "FP8", W70B_TP8 + 80 * 4, 2 * 80 * 1 * 128 * 1, 0.625 * MIB, 8 * 8192 * 8192 * 2,
     64 * 128256 * 4, 64934821568, 58441339411, 89174, 348),
]


def model(name: str) -> tuple[HFConfig, Family]:
    hf = read_hf_config(CONFIGS / name)
    return hf, family_for(hf, name)


@pytest.mark.parametrize(("name", "tp", "kv", "weights", "per_token", "block", "activations", "buffers", "left",
                          "pool", "blocks", "sequences"), TABLE,
                         ids=[f"{row[0].split('--')[1]}-tp{row[1]}-kv{row[2] or 'fp16'}" for row in TABLE])
def test_plan_figures_equal_the_hand_computation(name: str, tp: int, kv: str | None, weights: int, per_token: int,
                                                 block: float, activations: int, buffers: int, left: int, pool: int,
                                                 blocks: int, sequences: int) -> None:
    hf, family = model(name)
    plan = make_plan(hf, family, Mapping(tp, 1), Precision("float16", None, kv), gpu_from_table("H100-80GB"),
                     LIMITS)
    assert plan.gpu.memory_bytes == H100
    assert len(plan.ranks) == tp
    for rank in plan.ranks:  # pp = 1: every tensor-parallel rank holds the same
        figures = (rank.weight_bytes, rank.kv_bytes_per_token, rank.block_bytes, rank.activation_bytes,
                   rank.buffer_bytes, rank.free_bytes, rank.kv_pool_bytes, rank.num_blocks, rank.max_sequences)
        assert figures == (weights, per_token, block, activations, buffers, left, pool, blocks, sequences)
        assert rank.kv_tokens == blocks * 32
        assert rank.fits is (sequences >= 64)
    assert plan.fits is (sequences >= 64)


def test_spec_worked_examples() -> None:
    """§8: Llama-3-8B tp 2 pp 2 fp16 KV = 32 KiB/token/rank; Llama-3.1-8B tp 1 fp8 KV = 64 KiB/token, 2 MiB blocks."""
    hf, family = model(LLAMA3_8B)
    plan = make_plan(hf, family, Mapping(2, 2), Precision("float16"), gpu_from_table("H100-80GB"), LIMITS)
    assert [r.kv_bytes_per_token for r in plan.ranks] == [32 * 1024] * 4
    assert [r.num_layers for r in plan.ranks] == [16] * 4
    first = 2 * (128256 * 4096 + 16 * (2 * 4096 + 3072 * 4096 + 4096 * 2048 + 3 * 7168 * 4096))
    last = 2 * (64128 * 4096 + 4096 + 16 * (2 * 4096 + 3072 * 4096 + 4096 * 2048 + 3 * 7168 * 4096))
    assert [r.weight_bytes for r in plan.ranks] == [first, first, last, last]
    hf, family = model("meta-llama--Llama-3.1-8B")
    plan = make_plan(hf, family, Mapping(1, 1), Precision("bfloat16", None, "FP8"), gpu_from_table("H100"), LIMITS)
    assert (plan.ranks[0].kv_bytes_per_token, plan.ranks[0].block_bytes) == (64 * 1024, 2 * MIB)


LINEARS_8B = [(6144, 4096), (4096, 4096), (14336, 4096), (14336, 4096), (4096, 14336)]  # (out, in) per layer
REST_8B = 2 * (128256 * 4096 * 2 + 4096 + 32 * 2 * 4096)  # embedding, lm_head, ln_f, norms: model dtype


@pytest.mark.parametrize(("quant_algo", "per_layer"), [
    ("W8A16", sum(o * i + o * 2 for o, i in LINEARS_8B)),                      # int8 + fp16 per_channel_scale
    ("FP8", sum(o * i + 2 * 4 for o, i in LINEARS_8B)),                        # fp8 + two float32 scalars
    ("W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",                                   # int8 + float32 [1, out] scales
     sum(o * i + o * 4 for o, i in LINEARS_8B) + 4096 * 4 + 14336 * 4 + 2 * 4),  # + smoothers, norm scale_to_int
    ("W8A8_SQ_PER_TENSOR_PLUGIN",                                              # int8 + [1,1] scale + act_scale
     sum(o * i + 4 + 4 for o, i in LINEARS_8B) + 4096 * 4 + 14336 * 4 + 2 * 4 + 2 * 4  # + quantization_scaling
     + (6144 - 1) * 4),  # qkv's per_channel_scale is [1, out] (per q/k/v part), as the converter writes it
])
def test_quantized_weight_bytes(quant_algo: str, per_layer: int) -> None:
    hf, family = model(LLAMA3_8B)
    [weights] = rank_weight_bytes(hf, family, Mapping(1, 1), Precision("float16", quant_algo, None))
    assert weights == REST_8B + 32 * per_layer


def test_defaults_come_from_the_plan_not_from_upstream() -> None:
    """No limits given: max_batch_size = the sequences of max_seq_len that fit (56 here, not 2048)."""
    hf, family = model(LLAMA3_8B)
    plan = make_plan(hf, family, Mapping(1, 1), Precision("float16"), gpu_from_table("H100-80GB"), Limits())
    assert (plan.max_batch_size, plan.max_seq_len, plan.max_num_tokens, plan.max_input_len) == (56, 8192, 8192, 4096)
    assert plan.derived == ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
    assert plan.fits and plan.max_sequences == 56
    # with 56 sequences the logits buffers shrink, so 14495 blocks fit (14473 at the 256 the search started from)
    assert (plan.ranks[0].buffer_bytes, plan.ranks[0].num_blocks) == (56 * 128256 * 4, 14495)
    tiny = make_plan(hf, family, Mapping(8, 1), Precision("float16"), gpu_from_table("H200"), Limits(max_seq_len=512))
    assert tiny.max_batch_size == 256  # capped


@pytest.mark.parametrize(("limits", "buffers", "short", "fits"), [
    (Limits(), "0.1", "55.4", "--quant fp8 (3 sequence(s) of 8192 tokens), --tp 2 (8 sequence(s) of 8192 tokens)"),
    (LIMITS, "0.0", "55.3", "--tp 8 (174 sequence(s) of 8192 tokens)"),  # 64 sequences: fp8 (3), tp 2 (8), 4 (63) fail
], ids=["planned-limits", "max-batch-size-64"])
def test_infeasible_weights_are_refused_with_numbers_and_settings_that_fit(limits: Limits, buffers: str, short: str,
                                                                           fits: str) -> None:
    hf, family = model(LLAMA3_70B)
    plan = make_plan(hf, family, Mapping(1, 1), Precision("float16"), gpu_from_table("H100-80GB"), limits)
    assert not plan.fits and plan.ranks[0].free_bytes < 0
    with pytest.raises(KitUsageError) as exc:
        check_plan(plan, hf, family)
    assert str(exc.value) == (
        "the build does not fit on H100-80GB (79.6 GiB per GPU): rank 0 needs 131.4 GiB of weights + 3.5 GiB of "
        f"activations + {buffers} GiB of buffers, {short} GiB more than the GPU has; settings that fit: {fits}.")


def test_infeasible_batch_is_refused_with_the_nearest_limits() -> None:
    hf, family = model(LLAMA3_8B)
    plan = make_plan(hf, family, Mapping(1, 1), Precision("float16"), gpu_from_table("H100-80GB"), LIMITS)
    with pytest.raises(KitUsageError) as exc:
        check_plan(plan, hf, family)
    assert str(exc.value) == (
        "the build does not fit on H100-80GB (79.6 GiB per GPU): rank 0 has 62.9 GiB left after weights, activations "
        "and buffers; 0.9 of it holds 14494 KV blocks of 32 tokens (56.6 GiB), 56 sequence(s) of 8192 tokens, fewer "
        "than max_batch_size 64; settings that fit: --max-batch-size 56 (56 sequence(s) of 8192 tokens), "
        "--max-seq-len 7232 (64 sequence(s) of 7232 tokens), --kv-cache fp8 (113 sequence(s) of 8192 tokens).")
    for flag in ("--max-batch-size 56", "--max-seq-len 7232"):  # the suggestions really fit
        changes = {"--max-batch-size 56": {"max_batch_size": 56}, "--max-seq-len 7232": {"max_seq_len": 7232}}[flag]
        limits = replace(LIMITS, **changes)
        assert make_plan(hf, family, Mapping(1, 1), Precision("float16"), gpu_from_table("H100-80GB"), limits).fits


def test_a_gpu_too_small_for_anything_says_so() -> None:
    hf, family = model(LLAMA3_70B)
    plan = make_plan(hf, family, Mapping(1, 1), Precision("float16"), gpu_from_table("T4"), LIMITS)
    with pytest.raises(KitUsageError) as exc:  # tp 8 still needs 16.4 GiB per rank
        check_plan(plan, hf, family)
    assert str(exc.value) == (
        "the build does not fit on T4 (15.0 GiB per GPU): rank 0 needs 131.4 GiB of weights + 3.5 GiB of activations "
        "+ 0.0 GiB of buffers, 119.9 GiB more than the GPU has; no nearby setting fits: use a larger GPU.")


@pytest.mark.parametrize(("limits", "message"), [
    (Limits(tokens_per_block=48), "tokens_per_block must be a power of two, got 48."),
    (Limits(kv_cache_fraction=1.5), "kv_cache_fraction must be in (0, 1], got 1.5."),
    (Limits(max_batch_size=0), "max_batch_size must be a positive integer, got 0."),
    (Limits(max_seq_len=1024, max_input_len=2048),
     "max_input_len 2048 exceeds max_seq_len 1024; a prompt must leave room for output: lower --max-input-len or "
     "raise --max-seq-len."),
])
def test_bad_limits(limits: Limits, message: str) -> None:
    hf, family = model(LLAMA3_8B)
    with pytest.raises(KitUsageError) as exc:
        make_plan(hf, family, Mapping(1, 1), Precision("float16"), gpu_from_table("L4"), limits)
    assert str(exc.value) == message


def test_gpu_table_and_resolution() -> None:
    assert {"H100-80GB", "H200", "A100-40GB", "A100-80GB", "L40S", "L4", "A10G"} <= set(GPU_TABLE)
    h100 = gpu_from_table("h100")
    assert (h100.name, h100.memory_bytes, h100.sm, h100.is_hopper_or_newer) == ("H100-80GB", H100, "9.0", True)
    l4 = gpu_from_table("l4")
    assert (l4.sm, l4.has_fp8, l4.is_hopper_or_newer) == ("8.9", True, False)
    assert gpu_from_table("a100_40gb").name == "A100-40GB"
    with pytest.raises(KitUsageError, match=r"^--gpu 'B300' is not a known GPU; known: B200, H200, "):
        gpu_from_table("B300")
    visible = [gpu_from_table("A10G")]
    assert resolve_gpu(None, None, visible) is visible[0]                     # NVML when nothing is said
    assert resolve_gpu("L4", None, visible).name == "L4"                      # --gpu wins
    custom = resolve_gpu(None, 40, visible)
    assert (custom.memory_bytes, custom.compute_capability) == (40 * GIB, None)
    both = resolve_gpu("H100", 70, [])
    assert (both.memory_bytes, both.sm) == (70 * GIB, "9.0")
    assert resolve_gpu(None, None, []) is None
