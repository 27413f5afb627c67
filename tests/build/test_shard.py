"""Exact-slice tests of the split rules with ``arange`` weights (docs/trtllm-checkpoint.md §4.2–4.4).

Every element of an ``arange`` weight is distinct, so a shard can only equal the expected slice if it holds
exactly those rows or columns. Expected slices are written out by index here, never with ``torch.chunk``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trtllm_kit.checkpoint.shard import duplicate_kv_heads, qkv_parts, shard, split_qkv
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import shard_shape
from trtllm_kit.mapping import Mapping, check_tp, kv_heads_per_rank, layers_for_rank, pad_vocab_size
from trtllm_kit.models.base import Split


def arange(*shape: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + math.prod(shape), dtype=torch.float32).reshape(shape)


def heads(t: torch.Tensor, head_ids: list[int], head_dim: int) -> torch.Tensor:
    """Rows of the given heads, in the given order."""
    return torch.cat([t[h * head_dim:(h + 1) * head_dim] for h in head_ids])


def expected_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int, tp_size: int,
                 tp_rank: int) -> torch.Tensor:
    """Spec §4.3: rank r holds query heads [r*Nq/tp, (r+1)*Nq/tp) and KV heads [r*Nkv/tp, ...), or, when
    Nkv < tp, the one original KV head r // (tp/Nkv)."""
    num_heads, num_kv_heads = q.shape[0] // head_dim, k.shape[0] // head_dim
    q_ids = list(range(tp_rank * num_heads // tp_size, (tp_rank + 1) * num_heads // tp_size))
    if num_kv_heads >= tp_size:
        kv_ids = list(range(tp_rank * num_kv_heads // tp_size, (tp_rank + 1) * num_kv_heads // tp_size))
    else:
        kv_ids = [tp_rank // (tp_size // num_kv_heads)]
    return torch.cat([heads(q, q_ids, head_dim), heads(k, kv_ids, head_dim), heads(v, kv_ids, head_dim)])


# --- column, row, replicate ------------------------------------------------------------------------------

@pytest.mark.parametrize("tp_size", [1, 2, 4, 8])
def test_column_split_takes_row_blocks_and_reassembles(tp_size: int) -> None:
    weight, bias = arange(16, 6), arange(16)
    rows = 16 // tp_size
    weight_shards = [shard(weight, Split.COLUMN, tp_size, r) for r in range(tp_size)]
    bias_shards = [shard(bias, Split.COLUMN, tp_size, r) for r in range(tp_size)]
    for r in range(tp_size):
        assert torch.equal(weight_shards[r], weight[r * rows:(r + 1) * rows])
        assert torch.equal(bias_shards[r], bias[r * rows:(r + 1) * rows])
        assert tuple(weight_shards[r].shape) == shard_shape((16, 6), Split.COLUMN, tp_size)
        assert tuple(bias_shards[r].shape) == shard_shape((16,), Split.COLUMN, tp_size)
    assert torch.equal(torch.cat(weight_shards, dim=0), weight)
    assert torch.equal(torch.cat(bias_shards), bias)


@pytest.mark.parametrize("tp_size", [1, 2, 4, 8])
def test_row_split_takes_column_blocks_and_reassembles(tp_size: int) -> None:
    weight = arange(6, 16)
    cols = 16 // tp_size
    shards = [shard(weight, Split.ROW, tp_size, r) for r in range(tp_size)]
    for r, part in enumerate(shards):
        assert torch.equal(part, weight[:, r * cols:(r + 1) * cols])
        assert tuple(part.shape) == shard_shape((6, 16), Split.ROW, tp_size) == (6, cols)
    assert torch.equal(torch.cat(shards, dim=1), weight)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
@pytest.mark.parametrize("shape", [(16,), (6, 16)])
def test_replicate_gives_every_rank_the_full_tensor(tp_size: int, shape: tuple[int, ...]) -> None:
    tensor = arange(*shape)
    for r in range(tp_size):
        assert torch.equal(shard(tensor, Split.REPLICATE, tp_size, r), tensor)
    assert shard_shape(shape, Split.REPLICATE, tp_size) == shape


def test_shard_refuses_qkv() -> None:
    with pytest.raises(ValueError, match="split_qkv"):
        shard(arange(4, 2), Split.QKV, 2, 0)


# --- vocab padding ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp_size", [1, 2, 3, 4, 8])
def test_vocab_split_pads_with_zero_rows(tp_size: int) -> None:
    vocab, hidden = 67, 5
    weight = arange(vocab, hidden, start=1)  # start at 1: no original element is zero
    per_rank = math.ceil(vocab / tp_size)
    assert pad_vocab_size(vocab, tp_size) == per_rank * tp_size
    shards = [shard(weight, Split.VOCAB, tp_size, r) for r in range(tp_size)]
    for r, part in enumerate(shards):
        assert tuple(part.shape) == (per_rank, hidden) == shard_shape((vocab, hidden), Split.VOCAB, tp_size)
        real = weight[r * per_rank:min((r + 1) * per_rank, vocab)]
        assert torch.equal(part[:len(real)], real)
        assert torch.equal(part[len(real):], torch.zeros(per_rank - len(real), hidden))
    padded = torch.cat(shards)
    assert padded.shape == (pad_vocab_size(vocab, tp_size), hidden)
    assert torch.equal(padded[:vocab], weight)
    assert not padded[vocab:].any()


def test_vocab_split_keeps_dtype_of_padding() -> None:
    weight = arange(5, 3).to(torch.bfloat16)
    part = shard(weight, Split.VOCAB, 2, 1)
    assert part.dtype == torch.bfloat16 and part.shape == (3, 3)
    assert torch.equal(part, torch.cat([weight[3:], torch.zeros(1, 3, dtype=torch.bfloat16)]))


@settings(max_examples=50, deadline=None)
@given(vocab=st.integers(1, 300), hidden=st.integers(1, 4), tp_size=st.integers(1, 16))
def test_vocab_split_reassembles_property(vocab: int, hidden: int, tp_size: int) -> None:
    weight = arange(vocab, hidden, start=1)
    padded = torch.cat([shard(weight, Split.VOCAB, tp_size, r) for r in range(tp_size)])
    assert padded.shape[0] == pad_vocab_size(vocab, tp_size)
    assert padded.shape[0] % tp_size == 0 and padded.shape[0] - vocab < tp_size
    assert torch.equal(padded[:vocab], weight)
    assert not padded[vocab:].any()


# --- qkv, GQA and KV-head duplication -------------------------------------------------------------------

def test_duplicate_kv_heads_repeats_each_head_in_order() -> None:
    k = arange(2 * 3, 4)  # 2 heads of 3 rows
    dup = duplicate_kv_heads(k, num_kv_heads=2, tp_size=4)
    assert torch.equal(dup, torch.cat([k[0:3], k[0:3], k[3:6], k[3:6]]))
    assert torch.equal(duplicate_kv_heads(arange(6), 2, 4), torch.cat([arange(3), arange(3), arange(3, start=3),
                                                                         arange(3, start=3)]))
    assert duplicate_kv_heads(k, num_kv_heads=2, tp_size=2) is k


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "tp_size"),
    [
        (8, 8, 1), (8, 8, 2), (8, 8, 4),  # MHA
        (8, 2, 1), (8, 2, 2),              # GQA, Nkv >= tp
        (8, 4, 2),
        (8, 2, 4), (8, 2, 8),              # Nkv < tp: duplication
        (8, 1, 4),                         # MQA with duplication
    ],
)
def test_split_qkv_exact_heads(num_heads: int, num_kv_heads: int, tp_size: int) -> None:
    head_dim, hidden = 3, 5
    q = arange(num_heads * head_dim, hidden)
    k = arange(num_kv_heads * head_dim, hidden, start=10_000)
    v = arange(num_kv_heads * head_dim, hidden, start=20_000)
    parts = [split_qkv([q, k, v], num_kv_heads, tp_size, r) for r in range(tp_size)]
    q_rows = num_heads // tp_size * head_dim
    kv_rows = kv_heads_per_rank(num_kv_heads, tp_size) * head_dim
    assert kv_rows == math.ceil(num_kv_heads / tp_size) * head_dim
    for r, part in enumerate(parts):
        assert part.shape == (q_rows + 2 * kv_rows, hidden)
        assert part.shape == shard_shape(q.shape, Split.QKV, tp_size, qkv_rows=q_rows + 2 * kv_rows)
        assert torch.equal(part, expected_qkv(q, k, v, head_dim, tp_size, r))
        pieces = qkv_parts([q, k, v], num_kv_heads, tp_size, r)  # what the converter streams, unconcatenated
        assert [p.shape[0] for p in pieces] == [q_rows, kv_rows, kv_rows]
        assert torch.equal(torch.cat(pieces), part)
    # reassemble: q from every rank; k and v from one rank per original KV head
    assert torch.equal(torch.cat([p[:q_rows] for p in parts]), q)
    reps = max(1, tp_size // num_kv_heads)
    owners = parts[::reps]
    assert torch.equal(torch.cat([p[q_rows:q_rows + kv_rows] for p in owners]), k)
    assert torch.equal(torch.cat([p[q_rows + kv_rows:] for p in owners]), v)
    for r, part in enumerate(parts):  # duplicated copies equal their owner's
        assert torch.equal(part[q_rows:], parts[r - r % reps][q_rows:])


@pytest.mark.parametrize(("num_kv_heads", "tp_size"), [(2, 2), (2, 4), (1, 8)])
def test_split_qkv_bias(num_kv_heads: int, tp_size: int) -> None:
    head_dim, num_heads = 2, 8
    q = arange(num_heads * head_dim)
    k = arange(num_kv_heads * head_dim, start=1000)
    v = arange(num_kv_heads * head_dim, start=2000)
    for r in range(tp_size):
        part = split_qkv([q, k, v], num_kv_heads, tp_size, r)
        assert torch.equal(part, expected_qkv(q, k, v, head_dim, tp_size, r))


@st.composite
def qkv_layouts(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(Nq, Nkv, d, tp) that check_tp accepts."""
    num_kv_heads = draw(st.integers(1, 8))
    num_heads = num_kv_heads * draw(st.integers(1, 4))
    head_dim = draw(st.integers(1, 4))
    candidates = [tp for tp in (1, 2, 3, 4, 6, 8, 16) if num_heads % tp == 0
                  and (num_kv_heads % tp == 0 if num_kv_heads >= tp else tp % num_kv_heads == 0)]
    return num_heads, num_kv_heads, head_dim, draw(st.sampled_from(candidates))


@settings(max_examples=50, deadline=None)
@given(layout=qkv_layouts())
def test_split_qkv_property(layout: tuple[int, int, int, int]) -> None:
    num_heads, num_kv_heads, head_dim, tp_size = layout
    check_tp(num_heads, num_kv_heads, num_heads * 4, tp_size)
    q = arange(num_heads * head_dim, 2)
    k = arange(num_kv_heads * head_dim, 2, start=100_000)
    v = arange(num_kv_heads * head_dim, 2, start=200_000)
    parts = [split_qkv([q, k, v], num_kv_heads, tp_size, r) for r in range(tp_size)]
    q_rows = num_heads // tp_size * head_dim
    for r, part in enumerate(parts):
        assert part.shape[0] == (num_heads // tp_size + 2 * math.ceil(num_kv_heads / tp_size)) * head_dim
        assert torch.equal(part, expected_qkv(q, k, v, head_dim, tp_size, r))
    assert torch.equal(torch.cat([p[:q_rows] for p in parts]), q)
    kv_rows = math.ceil(num_kv_heads / tp_size) * head_dim
    owners = parts[::max(1, tp_size // num_kv_heads)]
    assert torch.equal(torch.cat([p[q_rows:q_rows + kv_rows] for p in owners]), k)
    assert torch.equal(torch.cat([p[q_rows + kv_rows:] for p in owners]), v)


# --- pipeline stages -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("num_layers", "pp_size", "stages"),
    [
        (3, 2, [[0, 1], [2]]),
        (5, 3, [[0, 1], [2, 3], [4]]),
        (32, 4, [list(range(0, 8)), list(range(8, 16)), list(range(16, 24)), list(range(24, 32))]),
        (22, 4, [list(range(0, 6)), list(range(6, 12)), list(range(12, 17)), list(range(17, 22))]),
        (4, 1, [[0, 1, 2, 3]]),
        (3, 3, [[0], [1], [2]]),
    ],
)
def test_layers_for_rank_tensor_split(num_layers: int, pp_size: int, stages: list[list[int]]) -> None:
    assert [list(layers_for_rank(num_layers, pp_size, p)) for p in range(pp_size)] == stages


@pytest.mark.parametrize(("num_layers", "pp_size"), [(3, 4), (1, 2), (32, 33)])
def test_layers_for_rank_refuses_more_stages_than_layers(num_layers: int, pp_size: int) -> None:
    with pytest.raises(KitUsageError, match=rf"pp_size {pp_size}\b.*\b{num_layers} layers"):
        layers_for_rank(num_layers, pp_size, 0)


@settings(max_examples=50, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 128))
def test_layers_for_rank_property(data: st.DataObject, num_layers: int) -> None:
    pp_size = data.draw(st.integers(1, num_layers))
    stages = [list(layers_for_rank(num_layers, pp_size, p)) for p in range(pp_size)]
    assert [layer for stage in stages for layer in stage] == list(range(num_layers))
    sizes = [len(s) for s in stages]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1 and min(sizes) >= 1
    reference = [t.tolist() for t in torch.tensor_split(torch.arange(num_layers), pp_size)]
    assert stages == reference


# --- rank numbering --------------------------------------------------------------------------------------

def test_mapping_rank_numbering() -> None:
    """Spec §4.1 example: 8 GPUs, tp=4, pp=2 → TP groups [0..3], [4..7]; PP groups [0,4], [1,5], ..."""
    mapping = Mapping(tp_size=4, pp_size=2)
    assert mapping.world_size == 8
    assert [[mapping.rank(t, p) for t in range(4)] for p in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [[mapping.rank(t, p) for p in range(2)] for t in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert all(mapping.rank(mapping.tp_rank(r), mapping.pp_rank(r)) == r for r in range(8))
    assert mapping.to_dict() == {"world_size": 8, "tp_size": 4, "pp_size": 2}


@pytest.mark.parametrize("bad", [{"tp_size": 0}, {"pp_size": -1}, {"tp_size": 2.0}])
def test_mapping_refuses_bad_sizes(bad: dict[str, object]) -> None:
    with pytest.raises(KitUsageError, match=repr(next(iter(bad.values())))):
        Mapping(**bad)
