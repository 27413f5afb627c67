"""The step's attention calls: which sequences attend together, and the padded inputs of each call.

Generation tokens (one query each) attend together, bucketed by key length so that no call pads a sequence's keys
to more than twice their length; each context chunk attends alone (no query padding across sequences).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Group(NamedTuple):
    """Sequences attended in one call: padded query rows and key slots, the mask, and where valid rows go."""

    q_index: torch.Tensor  # [G, T] packed-token index of each query row (padding repeats the last one)
    key_slots: torch.Tensor  # [G, S] pool slots of each sequence's keys (padding: slot 0)
    mask: torch.Tensor  # [G, 1, T, S]
    rows: torch.Tensor  # the valid (row, column) pairs of [G, T] ...
    cols: torch.Tensor
    out_index: torch.Tensor  # ... and their packed-token indices


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
    return Group(q_index, key_slots, mask[:, None], rows, cols, q_index[rows, cols])


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
