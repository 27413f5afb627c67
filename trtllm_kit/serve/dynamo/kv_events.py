"""The worker's KV cache events, from the CPU runtime's block manager to Dynamo's KV router.

The CPU ``LLM`` gives them as the LLM API does (``get_kv_cache_events``: ``stored`` blocks with their tokens and
parent hash, ``removed`` block hashes, unsigned 64-bit); Dynamo's ``KvEventPublisher`` takes signed 64-bit hashes.
The router hashes the tokens itself at the block size the worker registered (the artifact's ``tokens_per_block``),
so a prompt goes to the worker holding most of its prefix.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

EVENT_BUFFER = 4096  # events the CPU LLM keeps between two reads (kv_cache_config.event_buffer_max_size)
POLL_S = 0.02


class Publisher(Protocol):
    """What the worker needs of Dynamo's ``KvEventPublisher``."""

    def publish_stored(self, token_ids: list[int], num_block_tokens: list[int], block_hashes: list[int],
                       parent_hash: int | None = None) -> None: ...

    def publish_removed(self, block_hashes: list[int]) -> None: ...


class EventSource(Protocol):
    """What the worker needs of the CPU ``LLM``."""

    def get_kv_cache_events(self, timeout: float = 2) -> list[dict[str, Any]]: ...


def signed64(value: int) -> int:
    """An unsigned 64-bit hash as the signed 64-bit integer with the same bits.

    Arguments:
        value: a hash in [0, 2**64).
    """
    return value - (1 << 64) if value >= 1 << 63 else value


def publish(publisher: Publisher, event: dict[str, Any]) -> None:
    """Hand one LLM-API KV cache event to Dynamo's publisher.

    Arguments:
        publisher: the worker's ``KvEventPublisher``; event: one item of ``get_kv_cache_events()``.
    """
    data = event["data"]
    if data["type"] == "stored":
        parent = data.get("parent_hash")
        for block in data["blocks"]:
            token_ids = [int(token["token_id"]) for token in block["tokens"]]
            publisher.publish_stored(token_ids, [len(token_ids)], [signed64(int(block["block_hash"]))],
                                     None if parent is None else signed64(int(parent)))
            parent = block["block_hash"]
    elif data["type"] == "removed":
        publisher.publish_removed([signed64(int(h)) for h in data["block_hashes"]])


async def relay_events(llm: EventSource, publisher: Publisher) -> None:
    """Publish the LLM's KV cache events every ``POLL_S`` until cancelled.

    Arguments:
        llm: the worker's CPU ``LLM``; publisher: its ``KvEventPublisher``.
    """
    while True:
        for event in llm.get_kv_cache_events():
            publish(publisher, event)
        await asyncio.sleep(POLL_S)
