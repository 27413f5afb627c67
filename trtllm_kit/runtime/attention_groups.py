"""The step's attention calls: which sequences attend together, and the padded inputs of each call.

Generation tokens (one query each) attend together, bucketed by key length so that no call pads a sequence's keys
to more than twice their length; each context chunk attends alone (no query padding across sequences). A call of one
sequence whose keys lie in consecutive slots reads them as a view of the pool, other calls gather them with
``index_select``, and a call whose mask hides nothing (generation tokens of equal length) computes none: the same
values, fewer copies.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from trtllm_kit.runtime.layers import attend


class Group(NamedTuple):
    """Sequences attended in one call: padded query rows and key slots, the mask, and where valid rows go."""

    q_index: torch.Tensor  # [G, T] packed-token index of each query row (padding repeats the last one)
    key_slots: torch.Tensor  # [G, S] pool slots of each sequence's keys (padding: slot 0)
    mask: torch.Tensor | None  # [G, 1, T, S]; None: every key visible to every row
    rows: torch.Tensor  # the valid (row, column) pairs of [G, T] ...
    cols: torch.Tensor
    out_index: torch.Tensor  # ... and their packed-token indices
    key_span: slice | None  # the pool's slots of a single sequence's keys when consecutive (None: gather)


def group_inputs(starts: list[int], counts: list[int], offsets: list[int], slots: list[torch.Tensor]) -> Group:
    """The attention inputs of sequences computing ``counts`` tokens from ``starts``, packed at ``offsets``."""
    start, count, offset = (torch.tensor(v)[:, None] for v in (starts, counts, offsets))
    t = torch.arange(max(counts))[None, :]
    is_query = t < count  # [G, T]
    key_slots = torch.nn.utils.rnn.pad_sequence(slots, batch_first=True)
    j = torch.arange(key_slots.shape[1])[None, None, :]
    mask = ((j <= (start + t)[:, :, None]) & is_query[:, :, None]) | (~is_query[:, :, None] & (j == 0))
    rows, cols = is_query.nonzero(as_tuple=True)
    q_index = offset + torch.minimum(t, count - 1)
    return Group(q_index, key_slots, None if bool(mask.all()) else mask[:, None], rows, cols, q_index[rows, cols],
                 span_of(slots[0]) if len(slots) == 1 else None)


def span_of(slots: torch.Tensor) -> slice | None:
    """``slots`` as a slice of the pool when they are consecutive (a view reads or writes them), else None.

    Arguments:
        slots: [S] pool slots.
    """
    if not len(slots):
        return None
    first = int(slots[0])
    return slice(first, first + len(slots)) if torch.equal(slots, torch.arange(first, first + len(slots))) else None


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``cache[slots]`` through ``index_select`` (the same rows copied, in a few times less time than an index).

    Arguments:
        cache: [slots, ...] a layer's pool; slots: pool slots of any shape.
    """
    return cache.index_select(0, slots.flatten()).view(*slots.shape, *cache.shape[1:])


def attention_groups(starts: list[int], counts: list[int], offsets: list[int],
                     slots: list[torch.Tensor]) -> list[Group]:
    """The step's calls: sequence i computes ``counts[i]`` tokens from ``starts[i]``, packed at ``offsets[i]``, its
    keys in the pool's ``slots[i]``."""
    ends = [a + n for a, n in zip(starts, counts, strict=True)]
    members: list[list[int]] = []
    for i in sorted((i for i, n in enumerate(counts) if n == 1), key=ends.__getitem__):
        if not members or ends[i] > 2 * ends[members[-1][0]]:
            members.append([])
        members[-1].append(i)
    members += [[i] for i, n in enumerate(counts) if n > 1]
    return [group_inputs([starts[i] for i in m], [counts[i] for i in m], [offsets[i] for i in m],
                         [slots[i] for i in m]) for m in members]


def attend_groups(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, groups: list[Group],
                  masks: list[torch.Tensor | None], is_whole: bool) -> torch.Tensor:
    """One rank's attention context [heads, N, d] of a step's packed queries over the pool's keys and values.

    Arguments:
        q: [1, heads, N, d] the step's queries in packed order; k_cache, v_cache: the layer's pool [slots, kv_heads,
        d]; groups: the step's calls; masks: each call's mask repeated over the query heads of a KV head (None:
        none); is_whole: the step is one call whose rows are the packed tokens in order (no gather, no scatter).
    """
    pieces = []  # each group's valid rows [heads, rows, d]
    for g, mask in zip(groups, masks, strict=True):
        if g.key_span is not None:
            keys, values = k_cache[g.key_span][None].transpose(1, 2), v_cache[g.key_span][None].transpose(1, 2)
        else:
            keys, values = gather(k_cache, g.key_slots).transpose(1, 2), gather(v_cache, g.key_slots).transpose(1, 2)
        queries = q if is_whole and g.q_index.shape[0] == 1 else q[0][:, g.q_index].transpose(0, 1)  # [G, heads, T, d]
        shape, kv_heads = queries.shape, keys.shape[1]
        out = attend(queries.reshape(shape[0], kv_heads, -1, shape[-1]), keys, values, mask).reshape(shape)
        pieces.append(out[:, :, 0].transpose(0, 1) if shape[2] == 1  # generation tokens: every row
                      else out.transpose(0, 1)[:, g.rows, g.cols])
    if is_whole:
        return pieces[0]
    context = torch.empty_like(q[0])
    for g, piece in zip(groups, pieces, strict=True):
        context[:, g.out_index] = piece
    return context
