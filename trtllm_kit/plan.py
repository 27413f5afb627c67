"""The memory plan of an engine build: what each rank holds and how many sequences its KV cache serves.

Per rank ``r`` on a GPU of ``M`` bytes (formulas of ``docs/trtllm-checkpoint.md`` §8):

* weights: the bytes of ``rank{r}.safetensors`` after the build's quantization (W8A16: 1 byte per linear
  weight element + ``out_local`` scales in the model dtype; FP8: 1 byte + two float32 scalars per linear,
  lm_head kept; SmoothQuant plugins: 1 byte + float32 scales, smoothers and norm scales; a quantized KV cache
  adds one float32 scale per layer);
* KV bytes per token: ``2 × L_r × ceil(Nkv/tp) × d × b_kv``; a paged block is ``tokens_per_block`` of them;
* activations: ``ACTIVATION_FACTOR × max_num_tokens × max(H, I/tp) × 2`` (a heuristic; the engine's
  ``device_memory_size`` replaces it after a build);
* runtime buffers: float32 logits of ``max_batch_size × pad(V, tp)`` (why the upstream batch size of 2048
  runs out of memory);
* context logits (``[build] context_logits``, ``--gather_context_logits``): float32 logits of every token a step
  computes, ``max_num_tokens × pad(V, tp) × 4`` (derived from the flag's meaning; no upstream figure);
* memory left = ``M`` − weights − activations − buffers − context logits; KV pool = ``kv_cache_fraction`` × memory left;
  blocks = ⌊pool / block⌋; sequences at ``max_seq_len`` = ⌊blocks / ⌈max_seq_len / tokens_per_block⌉⌋.

A rank fits when ``max_batch_size`` sequences of ``max_seq_len`` tokens fit in its pool. Unless given,
``max_batch_size`` is the number of such sequences on the tightest rank (at most ``MAX_BATCH_SIZE``) and
``max_num_tokens`` is ``min(8192, max_batch_size × max_seq_len)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from trtllm_kit.build_limits import DraftMemory, Limits, check_limits
from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GIB, GPU
from trtllm_kit.layout import AWQ_GROUP_SIZE, LINEAR_WEIGHTS, PACKED_ALGOS, SQ_PREFIX, QuantLayout, rank_tensors
from trtllm_kit.mapping import Mapping, check_tp, kv_heads_per_rank, layers_for_rank, pad_vocab_size
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.precision import ITEMSIZE, Precision

ACTIVATION_FACTOR = 8
MAX_BATCH_SIZE = 256
MAX_NUM_TOKENS = 8192


@dataclass(frozen=True)
class RankPlan:
    """The memory figures of one rank, in bytes."""

    rank: int
    tp_rank: int
    pp_rank: int
    num_layers: int
    weight_bytes: int
    kv_bytes_per_token: int
    block_bytes: int
    activation_bytes: int
    buffer_bytes: int
    free_bytes: int
    kv_pool_bytes: int
    num_blocks: int
    kv_tokens: int
    max_sequences: int
    fits: bool
    context_logits_bytes: int = 0  # --gather_context_logits: float32 logits of max_num_tokens tokens


@dataclass(frozen=True)
class BuildPlan:
    """The settled limits and the per-rank figures of a build on one GPU type."""

    gpu: GPU
    precision: Precision
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    tokens_per_block: int
    kv_cache_fraction: float
    derived: tuple[str, ...]
    ranks: tuple[RankPlan, ...]
    context_logits: bool = False

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    @property
    def max_sequences(self) -> int:
        return min(r.max_sequences for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["gpu"] = self.gpu.to_dict()
        body["precision"] = {**asdict(self.precision), "kv_dtype": self.precision.kv_dtype}
        body["derived"] = list(self.derived)
        body["ranks"] = [asdict(rank) for rank in self.ranks]
        body["fits"] = self.fits
        body["max_sequences"] = self.max_sequences
        return body

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BuildPlan:
        """The plan ``to_dict`` wrote (a manifest's ``engine.plan``); the derived figures are recomputed.

        Arguments:
            values: the plan as written.
        """
        precision = values["precision"]
        names = {f.name for f in fields(RankPlan)}
        return cls(
            gpu=GPU.from_dict(values["gpu"]),
            precision=Precision(precision["dtype"], precision.get("quant_algo"), precision.get("kv_cache_quant_algo")),
            tp_size=int(values["tp_size"]), pp_size=int(values["pp_size"]),
            max_batch_size=int(values["max_batch_size"]), max_input_len=int(values["max_input_len"]),
            max_seq_len=int(values["max_seq_len"]), max_num_tokens=int(values["max_num_tokens"]),
            tokens_per_block=int(values["tokens_per_block"]), kv_cache_fraction=float(values["kv_cache_fraction"]),
            derived=tuple(values.get("derived", ())),
            ranks=tuple(RankPlan(**{k: v for k, v in r.items() if k in names}) for r in values["ranks"]))


def rank_weight_bytes(hf: HFConfig, family: Family, mapping: Mapping, precision: Precision) -> list[int]:
    """Bytes each rank holds once the build has quantized its weights: the checkpoint's tensors
    (``rank_tensors``), except that W8A16 and NVFP4 linears count as ``_linear_bytes`` says.

    Arguments:
        hf: the model config; family: its weight table; mapping: the TP/PP layout; precision: dtype and quant.
    """
    algo = precision.quant_algo
    if algo is not None and algo not in ("W8A16", "FP8", *PACKED_ALGOS) and not (algo.startswith(SQ_PREFIX)
                                                                   and algo.endswith("_PLUGIN")):
        raise KitUsageError(f"the planner has no weight formula for quant_algo {algo}; plan without it.")
    quant = QuantLayout(algo, precision.kv_cache_quant_algo)
    item = ITEMSIZE[precision.dtype]
    stages = []
    for pp_rank in range(mapping.pp_size):  # every rank of a stage holds the same shapes
        tensors = rank_tensors(hf, family, mapping, mapping.rank(0, pp_rank), quant, precision.dtype)
        stages.append(sum(_linear_bytes(algo, spec.shape, item) if algo in ("W8A16", *PACKED_ALGOS)
                          and name.endswith(LINEAR_WEIGHTS) else spec.nbytes for name, spec in tensors.items()))
    return [stages[mapping.pp_rank(rank)] for rank in mapping.ranks()]


def _linear_bytes(algo: str, shape: tuple[int, ...], item: int) -> int:
    """W8A16: int8 weights and ``out`` scales in the model dtype; NVFP4: e2m1 two per byte, an e4m3 scale per 16
    elements and two float32 scalars (``quant/nvfp4.py``); W4A16 AWQ: int4 two per byte, a float32 scale per 128
    elements and a ``pre_quant_scale`` per input feature (``quant/awq.py``)."""
    numel = math.prod(shape)
    if algo == "W8A16":
        return numel + shape[0] * item
    if algo == "W4A16_AWQ":
        return numel // 2 + numel // AWQ_GROUP_SIZE * 4 + shape[-1] * item
    return numel // 2 + numel // 16 + 8


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_bytes: int) -> int:
    """``2 × L_r × Nkv_r × d × b_kv``: K and V of one token on one rank."""
    return 2 * num_layers * num_kv_heads * head_dim * kv_bytes


def activation_bytes(max_num_tokens: int, hidden_size: int, intermediate_size: int, tp_size: int) -> int:
    """``ACTIVATION_FACTOR × max_num_tokens × max(H, I/tp) × 2`` (a heuristic, §8)."""
    return ACTIVATION_FACTOR * max_num_tokens * max(hidden_size, intermediate_size // tp_size) * 2


def buffer_bytes(max_batch_size: int, vocab_size: int, tp_size: int) -> int:
    """Float32 logits for every sequence of a batch: ``max_batch_size × pad(V, tp) × 4``."""
    return max_batch_size * pad_vocab_size(vocab_size, tp_size) * 4


def context_logits_bytes(max_num_tokens: int, vocab_size: int, tp_size: int) -> int:
    """Float32 logits of every token of a step, kept for ``--gather_context_logits``: ``max_num_tokens × pad(V, tp)
    × 4``."""
    return max_num_tokens * pad_vocab_size(vocab_size, tp_size) * 4


def rank_plans(hf: HFConfig, family: Family, mapping: Mapping, precision: Precision, gpu: GPU, max_batch_size: int,
               max_seq_len: int, max_num_tokens: int, tokens_per_block: int,
               kv_cache_fraction: float, context_logits: bool = False,
               draft: DraftMemory | None = None) -> tuple[RankPlan, ...]:
    """The figures of every rank for fixed limits.

    Arguments:
        hf: model config; family: weight table; mapping: TP/PP; precision: dtype and quant; gpu: the GPU;
        max_batch_size, max_seq_len, max_num_tokens, tokens_per_block, kv_cache_fraction: the limits;
        context_logits: whether the engine gathers context logits; draft: speculation's draft model (on every rank).
    """
    weights = [w + (draft.weight_bytes if draft else 0) for w in rank_weight_bytes(hf, family, mapping, precision)]
    activations = activation_bytes(max_num_tokens, hf.hidden_size, hf.intermediate_size, mapping.tp_size)
    buffers = buffer_bytes(max_batch_size, hf.vocab_size, mapping.tp_size)
    context = context_logits_bytes(max_num_tokens, hf.vocab_size, mapping.tp_size) if context_logits else 0
    kv_heads = kv_heads_per_rank(hf.num_key_value_heads, mapping.tp_size)
    blocks_per_sequence = math.ceil(max_seq_len / tokens_per_block)
    plans = []
    for rank in range(mapping.world_size):
        pp_rank = mapping.pp_rank(rank)
        layers = len(layers_for_rank(hf.num_hidden_layers, mapping.pp_size, pp_rank))
        per_token = kv_bytes_per_token(layers, kv_heads, hf.head_dim, precision.kv_bytes) + \
            (draft.kv_bytes_per_token if draft else 0)
        block = tokens_per_block * per_token
        free = gpu.memory_bytes - weights[rank] - activations - buffers - context
        pool = max(0, int(kv_cache_fraction * free))
        blocks = pool // block
        sequences = blocks // blocks_per_sequence
        plans.append(RankPlan(rank, mapping.tp_rank(rank), pp_rank, layers, weights[rank], per_token, block,
                              activations, buffers, free, pool, blocks, blocks * tokens_per_block, sequences,
                              free > 0 and sequences >= max(1, max_batch_size), context))
    return tuple(plans)


def make_plan(hf: HFConfig, family: Family, mapping: Mapping, precision: Precision, gpu: GPU,
              limits: Limits) -> BuildPlan:
    """Settle the limits the user left open and compute every rank's figures (may not fit; see ``check_plan``).

    Arguments:
        hf: model config; family: weight table; mapping: TP/PP; precision: dtype and quant; gpu: the GPU;
        limits: what the user asked for.
    """
    check_limits(limits)
    check_tp(hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size, mapping.tp_size)
    max_seq_len = limits.max_seq_len or hf.max_position_embeddings
    derived = [name for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
               if getattr(limits, name) is None]
    batch = limits.max_batch_size or MAX_BATCH_SIZE
    while True:
        tokens = limits.max_num_tokens or max(limits.tokens_per_block, min(MAX_NUM_TOKENS, batch * max_seq_len)) + \
            batch * (limits.draft.draft_len if limits.draft else 0)
        ranks = rank_plans(hf, family, mapping, precision, gpu, batch, max_seq_len, tokens,
                           limits.tokens_per_block, limits.kv_cache_fraction, limits.context_logits, limits.draft)
        sequences = min(r.max_sequences for r in ranks)
        if limits.max_batch_size or sequences >= batch or sequences < 1:
            break
        batch = sequences
    max_input_len = limits.max_input_len or max(1, min(max_seq_len // 2, tokens))
    if max_input_len > max_seq_len:
        raise KitUsageError(f"max_input_len {max_input_len} exceeds max_seq_len {max_seq_len}; a prompt must leave "
                            "room for output: lower --max-input-len or raise --max-seq-len.")
    return BuildPlan(gpu, precision, mapping.tp_size, mapping.pp_size, batch, max_input_len, max_seq_len, tokens,
                     limits.tokens_per_block, limits.kv_cache_fraction, tuple(derived), ranks, limits.context_logits)


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def with_changes(plan: BuildPlan, hf: HFConfig, family: Family, **changes: Any) -> BuildPlan | None:
    """The plan with some settings changed, or None when that layout is invalid for the model.

    Arguments:
        plan: the original plan; hf: model config; family: weight table;
        changes: ``tp``, ``quant_algo``, ``kv_cache_quant_algo`` or a ``Limits`` field.
    """
    precision = replace(plan.precision, **{k: changes.pop(k) for k in ("quant_algo", "kv_cache_quant_algo")
                                           if k in changes})
    mapping = Mapping(changes.pop("tp", plan.tp_size), plan.pp_size)
    given = {name: getattr(plan, name) for name in ("max_batch_size", "max_input_len", "max_seq_len",
                                                    "max_num_tokens") if name not in plan.derived}
    limits = Limits(**{**given, **changes}, tokens_per_block=plan.tokens_per_block,
                    kv_cache_fraction=plan.kv_cache_fraction, context_logits=plan.context_logits)
    try:
        return make_plan(hf, family, mapping, precision, plan.gpu, limits)
    except KitUsageError:
        return None
