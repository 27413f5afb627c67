"""A prompt's prefix as the prefix router and the replicas name it: a digest of its first KV cache block.

Two prompts with the same key share at least their first ``tokens_per_block`` token ids (a block the engine can
reuse), or, for a text prompt (an artifact without a tokenizer), their first ``tokens_per_block *
CHARS_PER_TOKEN`` characters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

CHARS_PER_TOKEN = 4  # a text prompt's block, in characters


def prefix_key(prompt: str | Sequence[int], tokens_per_block: int) -> str | None:
    """The key of ``prompt``'s first block, or None when the prompt is shorter than a block (nothing to reuse).

    Arguments:
        prompt: text or token ids; tokens_per_block: the engine's KV cache block, in tokens.
    """
    if isinstance(prompt, str):
        size = tokens_per_block * CHARS_PER_TOKEN
        head = prompt[:size].encode()
        if len(prompt) < size:
            return None
    else:
        if len(prompt) < tokens_per_block:
            return None
        head = b",".join(str(int(token)).encode() for token in prompt[:tokens_per_block])
    return hashlib.blake2b(head, digest_size=8).hexdigest()
