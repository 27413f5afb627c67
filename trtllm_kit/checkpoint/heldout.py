"""The held-out text (``quality.heldout_path``; calibration reads the corpus) in windows of the model's tokens, and
what a checkpoint scores on them against the unquantized model: perplexities, KL divergence, top-1 agreement."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from trtllm_kit.checkpoint.quality import heldout_path

Forward = Callable[[torch.Tensor], torch.Tensor]
PERPLEXITY_WINDOW = 256
PERPLEXITY_MAX_TOKENS = 2048


def corpus_windows(hf_dir: Path, window: int = PERPLEXITY_WINDOW,
                   max_tokens: int = PERPLEXITY_MAX_TOKENS) -> list[list[int]]:
    """Consecutive windows of the held-out text (``heldout_path``; calibration reads the corpus), tokenized with
    the model's tokenizer, for perplexity.

    Arguments:
        hf_dir: the HF model (its tokenizer); window: tokens per window; max_tokens: tokens in all.
    """
    from transformers import AutoTokenizer


    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    stream: list[int] = []
    for line in heldout_path().read_text(encoding="utf-8").splitlines():
        if line.strip():
            stream += tokenizer(line, add_special_tokens=False)["input_ids"]
        if len(stream) >= max_tokens:
            break
    stream = stream[:max_tokens]
    return [stream[i:i + window] for i in range(0, len(stream), window) if len(stream[i:i + window]) > 1]


def corpus_scores(forward: Forward, reference: Forward,
                  windows: list[list[int]]) -> tuple[float, float, float, float]:
    """(perplexity of ``forward``, perplexity of ``reference``, mean KL(reference ‖ forward), share of tokens
    whose argmax agrees) over the windows.

    Arguments:
        forward: token ids [1, T] → logits [1, T, V] (the checkpoint); reference: the same for the HF model;
        windows: token-id lists.
    """
    with torch.no_grad():
        reference_logits = (reference(torch.tensor([ids], dtype=torch.int64)) for ids in windows)
        return window_scores(forward, reference_logits, windows)


def window_scores(forward: Forward, reference_logits: Iterable[torch.Tensor],
                  windows: list[list[int]]) -> tuple[float, float, float, float]:
    """``corpus_scores`` with the reference's logits [1, T, V] of each window given.

    Arguments:
        forward: token ids [1, T] → logits [1, T, V] (the checkpoint); reference_logits: the HF model's, one per
        window; windows: token-id lists.
    """
    nll = nll_ref = kl = 0.0
    count = agree = 0
    with torch.no_grad():
        for ids, logits in zip(windows, reference_logits, strict=True):
            batch, targets = torch.tensor([ids], dtype=torch.int64), torch.tensor(ids[1:])
            got = forward(batch).float()[0, :-1].log_softmax(-1)
            want = logits.float()[0, :-1].log_softmax(-1)
            nll += float(torch.nn.functional.nll_loss(got, targets, reduction="sum"))
            nll_ref += float(torch.nn.functional.nll_loss(want, targets, reduction="sum"))
            kl += float((want.exp() * (want - got)).sum())
            agree += int((got.argmax(-1) == want.argmax(-1)).sum())
            count += len(ids) - 1
    if not count:
        return math.nan, math.nan, math.nan, math.nan
    return math.exp(nll / count), math.exp(nll_ref / count), kl / count, agree / count
