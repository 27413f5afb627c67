"""The step's attention calls: which shortcuts a call takes (a view of consecutive key slots, no mask when nothing is
hidden, no gather or scatter of a single packed call), and that they give the general path's bits."""

from __future__ import annotations

import pytest
import torch

from trtllm_kit.runtime.attention_groups import Group, attend_groups, attention_groups, gather, group_inputs, span_of

HEADS, KV_HEADS, HEAD_SIZE, POOL = 6, 2, 8, 64


def test_consecutive_slots_are_a_span_and_others_are_gathered():
    assert span_of(torch.arange(16, 21)) == slice(16, 21)
    assert span_of(torch.cat([torch.arange(32, 36), torch.arange(8, 12)])) is None
    assert span_of(torch.tensor([], dtype=torch.long)) is None
    one = group_inputs([4], [1], [0], [torch.arange(16, 21)])
    two = group_inputs([4, 4], [1, 1], [0, 1], [torch.arange(16, 21), torch.arange(40, 45)])
    assert one.key_span == slice(16, 21) and two.key_span is None


@pytest.mark.parametrize("slots", [torch.tensor([[5, 6, 7, 0], [40, 41, 3, 2]]), torch.tensor([63, 0, 17]),
                                   torch.tensor([], dtype=torch.long)])
def test_a_gather_copies_the_indexed_rows(slots):
    cache = torch.randn(POOL, KV_HEADS, HEAD_SIZE)
    got = gather(cache, slots)
    assert got.shape == (*slots.shape, KV_HEADS, HEAD_SIZE) and torch.equal(got, cache[slots])
    cache.zero_()
    assert got.numel() == 0 or bool(got.abs().sum() > 0)  # a copy, not a view of the pool


def test_a_call_that_hides_nothing_has_no_mask():
    equal = group_inputs([4, 4], [1, 1], [0, 1], [torch.arange(0, 5), torch.arange(8, 13)])
    unequal = group_inputs([4, 2], [1, 1], [0, 1], [torch.arange(0, 5), torch.arange(8, 11)])
    prompt = group_inputs([0], [5], [0], [torch.arange(0, 5)])
    assert equal.mask is None
    assert unequal.mask is not None and not bool(unequal.mask.all())
    assert prompt.mask is not None and not bool(prompt.mask.all())


def general(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, groups: list[Group]) -> torch.Tensor:
    """The same calls with every key gathered, every mask applied and every row scattered."""
    full = []
    for g in groups:
        everything = torch.ones(g.q_index.shape[0], 1, g.q_index.shape[1], g.key_slots.shape[1], dtype=torch.bool)
        full.append(g._replace(key_span=None, mask=everything if g.mask is None else g.mask))
    masks = [g.mask.repeat(1, 1, HEADS // KV_HEADS, 1) for g in full if g.mask is not None]
    return attend_groups(q, k_cache, v_cache, full, list(masks), is_whole=False)


@pytest.mark.parametrize("starts, counts, slots", [
    ([9], [1], [torch.arange(20, 30)]),  # batch 1 decode, consecutive slots
    ([0], [7], [torch.arange(3, 10)]),  # one prompt
    ([9, 9], [1, 1], [torch.arange(20, 30), torch.arange(40, 50)]),  # equal generation lengths: no mask
    ([9, 3, 0], [1, 1, 4], [torch.cat([torch.arange(50, 54), torch.arange(0, 6)]), torch.arange(30, 34),
                            torch.arange(10, 14)]),  # mixed, gathered
])
def test_shortcuts_give_the_general_paths_bits(starts, counts, slots):
    torch.manual_seed(0)
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    num_tokens = sum(counts)
    k_cache, v_cache = torch.randn(POOL, KV_HEADS, HEAD_SIZE), torch.randn(POOL, KV_HEADS, HEAD_SIZE)
    q = torch.randn(1, HEADS, num_tokens, HEAD_SIZE)
    groups = attention_groups(starts, counts, offsets, slots)
    masks = [None if g.mask is None else g.mask.repeat(1, 1, HEADS // KV_HEADS, 1) for g in groups]
    is_whole = len(groups) == 1 and groups[0].out_index.tolist() == list(range(num_tokens))
    got = attend_groups(q, k_cache, v_cache, groups, masks, is_whole)
    assert got.shape == (HEADS, num_tokens, HEAD_SIZE)
    assert torch.equal(got, general(q, k_cache, v_cache, groups))
