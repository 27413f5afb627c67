"""Drafts sent with the request (``draft_input_ids``: the tokens a draft model proposed after the prompt, as the
``tensorrt_llm_bls``'s draft-target loop sends them): the ``Speculator``'s proposer for them.

The prompt's step makes the first token, which the draft's first token guessed; while a sequence's output still
follows its draft, the rest of the draft is proposed, to be verified in the next step's forward pass (greedy keeps
the target's choice; sampling accepts by rejection against the one-hot draft, ``draft_acceptance.py``). Once the
output leaves the draft, nothing more is proposed.
"""

from __future__ import annotations

from trtllm_kit.runtime.sequence import Sequence


def remaining_draft(draft_ids: tuple[int, ...], output_ids: list[int]) -> list[int]:
    """The draft tokens after ``output_ids`` while the output follows the draft, else none.

    Arguments:
        draft_ids: the request's draft; output_ids: the tokens generated so far.
    """
    num_output = len(output_ids)
    if num_output >= len(draft_ids) or list(draft_ids[:num_output]) != output_ids:
        return []
    return list(draft_ids[num_output:])


class ExternalDrafts:
    """Proposes each sequence's remaining ``params.draft_ids``; holds no state."""

    def propose(self, seqs: list[Sequence], max_draft_lens: list[int]) -> list[list[int]]:
        """Each sequence's remaining draft, at most its ``max_draft_lens`` entry long.

        Arguments:
            seqs: sequences in generation; max_draft_lens: the longest draft each may take.
        """
        return [remaining_draft(seq.params.draft_ids, seq.output_ids)[:k]
                for seq, k in zip(seqs, max_draft_lens, strict=True)]

    def forget(self, seq: Sequence) -> None:
        """Nothing is held per sequence.

        Arguments:
            seq: a finished sequence.
        """
