"""n-gram speculation (prompt lookup): the draft is what followed the latest earlier occurrence of the sequence's
last ``n`` tokens in its prompt and output, trying the longest ``n`` first."""

from __future__ import annotations

from trtllm_kit.runtime.sequence import Sequence

DEFAULT_MAX_NGRAM = 3  # the longest suffix matched (upstream NGram's max_matching_ngram_size default is 4; vLLM 3-5)


def prompt_lookup(token_ids: list[int], max_draft_len: int, max_ngram: int = DEFAULT_MAX_NGRAM) -> list[int]:
    """Up to ``max_draft_len`` tokens that followed the latest earlier match of the last ``n`` tokens (``n`` from
    ``max_ngram`` down to 1); none when nothing matches.

    Arguments:
        token_ids: the sequence so far; max_draft_len: K; max_ngram: the longest suffix tried.
    """
    length = len(token_ids)
    for n in range(min(max_ngram, length - 1), 0, -1):
        suffix = token_ids[length - n:]
        first = suffix[0]
        for start in range(length - n - 1, -1, -1):  # latest match first; the suffix itself is excluded
            if token_ids[start] == first and token_ids[start:start + n] == suffix:
                return token_ids[start + n:start + n + max_draft_len]
    return []


class PromptLookup:
    """Proposes each sequence's draft from its own tokens; holds no state."""

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, max_draft_len: int | None = None) -> None:
        """Arguments:
        max_ngram: the longest suffix matched; max_draft_len: its own bound on a draft (None: the speculator's).
        """
        self.max_ngram, self.max_draft_len = max_ngram, max_draft_len

    def propose(self, seqs: list[Sequence], max_draft_lens: list[int]) -> list[list[int]]:
        """Each sequence's draft, at most its ``max_draft_lens`` entry long.

        Arguments:
            seqs: sequences in generation; max_draft_lens: the longest draft each may take.
        """
        bound = self.max_draft_len
        return [prompt_lookup(seq.token_ids, k if bound is None else min(k, bound), self.max_ngram)
                for seq, k in zip(seqs, max_draft_lens, strict=True)]

    def forget(self, seq: Sequence) -> None:
        """Nothing is held per sequence.

        Arguments:
            seq: a finished sequence.
        """
