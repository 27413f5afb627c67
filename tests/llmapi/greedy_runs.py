"""Greedy decoding by full recompute, the reference the llmapi quantization tests compare the CPU runtime with: the
prompts (token ids of the built-in models' vocabulary) and how many tokens each runs."""

from __future__ import annotations

from collections.abc import Callable

import torch

PROMPTS = ([1, 17, 305, 9, 44], [1, 600, 601, 2, 73, 73, 19, 5, 250])
NEW_TOKENS = 12


def greedy(forward: Callable[[torch.Tensor], torch.Tensor], prompt: list[int]) -> list[int]:
    """The ``NEW_TOKENS`` tokens after ``prompt``, each the argmax of ``forward`` (ids [1, T] → logits [1, T, V]) over
    the whole sequence so far.

    Arguments:
        forward: the model's logits of a batch of one; prompt: token ids.
    """
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(forward(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]
