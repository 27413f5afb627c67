"""Log-probabilities of tokens under the model's raw distribution: the sampled token's and the top alternatives.

They are the log-softmax of the model's logits before anything the request changes (penalties, temperature,
top-k/top-p/min-p, grammar masks, the minimum length's end-token mask), as vLLM's default ("raw") logprobs and as the
log-softmax ``transformers`` gives for the same model: the numbers evaluation harnesses compare across servers.
Logits of position ``i`` score token ``i + 1``, so the first prompt token has no logprob.
"""

from __future__ import annotations

import torch

from trtllm_kit.runtime.sequence import Sequence, TokenLogprob


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """The logprob of ``token_ids[i]`` under ``logits[i]`` with its rank and the ``num_top`` best alternatives.

    Arguments:
        logits: [N, vocab] raw logits (float32); token_ids: N tokens scored; num_top: alternatives kept (0: none).
    """
    if not token_ids:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(token_ids)
    chosen = logprobs.gather(1, ids[:, None])[:, 0]
    ranks = (logprobs > chosen[:, None]).sum(dim=1) + 1
    top = torch.topk(logprobs, min(num_top, logprobs.shape[1]), dim=1) if num_top else None
    return [TokenLogprob(token_ids[i], float(chosen[i]), int(ranks[i]),
                         tuple(top.indices[i].tolist()) if top is not None else (),
                         tuple(top.values[i].tolist()) if top is not None else ())
            for i in range(len(token_ids))]


def sampled_logprob(logits: torch.Tensor, token_id: int) -> float:
    """The raw logprob of one token under one row of logits.

    Arguments:
        logits: [vocab] raw logits; token_id: the token.
    """
    return float(torch.log_softmax(logits.float(), dim=-1)[token_id])


def record_generated(logits: torch.Tensor, sampled: list[Sequence], kept: list[bool]) -> None:
    """Add each kept token's raw logprob to its sequence's ``cum_logprob`` (and its alternatives and logits to
    ``output_logprobs`` / ``generation_logits`` on request).

    Arguments:
        logits: [len(sampled), vocab] the raw logits each token was chosen from; sampled: the sequences;
        kept: whether each one's token was appended (an ``end_id`` is not, unless ``keep_end_token``).
    """
    rows = [row for row, is_kept in enumerate(kept) if is_kept]
    if not rows:
        return
    token_ids = [sampled[row].token_ids[-1] for row in rows]
    chosen = torch.log_softmax(logits.float(), dim=-1)[rows, token_ids].tolist()  # one gather for the step
    for row, token_id, logprob in zip(rows, token_ids, chosen, strict=True):
        seq = sampled[row]
        seq.cum_logprob += logprob
        if seq.params.logprobs is not None:
            seq.output_logprobs += token_logprobs(logits[row:row + 1], [token_id], seq.params.logprobs)
        if seq.params.return_generation_logits:
            seq.generation_logits.append(logits[row].clone())


def record_prompt(seq: Sequence, start: int, logits: torch.Tensor) -> None:
    """Keep the logits of prompt positions ``start``... (``context_logits``) and the logprobs of the tokens they
    score (``prompt_logprobs``), once each: a preempted sequence computes its prompt again.

    Arguments:
        seq: a sequence that asked for them; start: the first position; logits: [positions, vocab] raw logits.
    """
    end = start + logits.shape[0]
    if seq.params.return_context_logits:
        seq.context_logits += [logits[p - start].clone() for p in range(max(start, len(seq.context_logits)), end)]
    if seq.params.prompt_logprobs is not None:
        positions = range(max(start, len(seq.prompt_logprobs) - 1), min(end, seq.num_prompt_tokens - 1))
        seq.prompt_logprobs += token_logprobs(logits[[p - start for p in positions]],
                                              [seq.token_ids[p + 1] for p in positions], seq.params.prompt_logprobs)
