"""A SentencePiece BPE vocabulary (``tokenizer.ggml.model`` ``llama``: Llama 1-2, Mistral) as a ``tokenizers`` BPE.

GGUF stores such a vocabulary as pieces with scores, no merges: a piece made of two pieces is merged in the order of
its score, highest first, so the merges are every split of a piece into two pieces of the vocabulary, sorted by the
whole piece's score. Text is spelled as SentencePiece does (spaces as ``▁``, a ``▁`` in front of the text and of
the text after each special token, as llama.cpp adds it) and characters outside the vocabulary fall back to their
UTF-8 bytes (the ``<0xXX>`` pieces).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers

SPACE = "\u2581"
BYTE = 6  # tokenizer.ggml.token_type of a <0xXX> piece


def spm_merges(tokens: list[str], scores: list[float], token_types: list[int]) -> list[tuple[str, str]]:
    """The BPE merges a scored vocabulary implies, highest-scored result first (ties: the left piece's id, then the
    right one's).

    Arguments:
        tokens: the pieces by id; scores: their scores; token_types: their kinds (byte pieces never merge).
    """
    ids = {token: index for index, token in enumerate(tokens) if token_types[index] != BYTE}
    found = []
    for token, score in zip(tokens, scores, strict=True):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                found.append((-score, ids[left], ids[right], left, right))
    return [(left, right) for *_, left, right in sorted(found)]


def spm_tokenizer(tokens: list[str], scores: list[float], token_types: list[int], unk: str | None,
                  add_space_prefix: bool) -> Tokenizer:
    """The tokenizer without its added tokens and post-processor (the caller's, as for byte-level BPE).

    Arguments:
        tokens, scores, token_types: the vocabulary; unk: the unknown piece; add_space_prefix: ``▁`` before the text.
    """
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, token_types), unk_token=unk,
                                     fuse_unk=True, byte_fallback=True))
    spaces = [normalizers.Replace(" ", SPACE)]
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), *spaces] if add_space_prefix else spaces)
    strip = [decoders.Strip(content=" ", left=1, right=0)] if add_space_prefix else []
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                           *strip])
    return tokenizer
