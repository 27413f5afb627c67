"""The worker's KV cache events for Dynamo's KV router: a prompt's blocks announced when it arrives, the block
manager's sealed and evicted blocks relayed, each block published once.

The router learns what a worker holds from its ``stored`` and ``removed`` events. A block sealed by the block
manager is known only once its prefill has run; a second request of the same prefix routed before that goes to
another worker. So the worker announces a request's full prompt blocks as ``stored`` when it takes the request
(``announce``), owned by that request until the block manager seals them (then nothing more is published for
them) or until the request ends unsealed (``release``: cancelled before its prefill ran, they are ``removed``).
The CPU ``LLM`` gives the block manager's events as the LLM API does (``get_kv_cache_events``: ``stored`` blocks
with their tokens and parent hash, ``removed`` block hashes, under the block manager's own hashes); the worker
publishes every block under the router's sequence hash (``router_hashes.py``), so that both workers name a shared
prefix alike, and ``removed`` goes out when the pool hands a sealed block out again and no request still owns it.
Dynamo's ``KvEventPublisher`` takes signed 64-bit hashes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from trtllm_kit.serve.dynamo.router_hashes import prompt_hashes, sequence_hash

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


class RouterBlocks:
    """The blocks the router holds for this worker, by sequence hash: each sealed by the block manager (under one
    or more of its hashes) or announced by requests not yet sealed, and published once.

    Arguments:
        publisher: the worker's ``KvEventPublisher``; block_size: its tokens per KV block.
    """

    def __init__(self, publisher: Publisher, block_size: int) -> None:
        self.publisher, self.block_size = publisher, block_size
        self.sequence_hashes: dict[int, int] = {}  # block manager hash of a sealed block -> its sequence hash
        self.num_sealed: dict[int, int] = {}  # sequence hash -> sealed blocks under it (block manager hashes)
        self.owners: dict[int, set[str]] = {}  # sequence hash -> requests that announced it, unsealed
        self.announced: dict[str, list[int]] = {}  # request id -> the sequence hashes it owns, first block first

    def is_published(self, block: int) -> bool:
        """Whether the router has been told this worker holds the block of sequence hash ``block``.

        Arguments:
            block: a sequence hash.
        """
        return block in self.num_sealed or block in self.owners

    def announce(self, request_id: str, token_ids: list[int]) -> None:
        """Publish the full blocks of a request's tokens the router does not have yet; the request owns every
        one of them that is not sealed.

        Arguments:
            request_id: the request; token_ids: the tokens its prefill computes (a migrated request's included).
        """
        parent: int | None = None
        owned: list[int] = []
        for index, block in enumerate(prompt_hashes(token_ids, self.block_size)):
            if block not in self.num_sealed:
                if block not in self.owners:
                    tokens = token_ids[index * self.block_size:(index + 1) * self.block_size]
                    self._stored(tokens, block, parent)
                self.owners.setdefault(block, set()).add(request_id)
                owned.append(block)
            parent = block
        if owned:
            self.announced[request_id] = owned

    def release(self, request_id: str) -> None:
        """A request has ended: what it announced and nothing sealed or another request owns is removed.

        Arguments:
            request_id: the request; its blocks' sealed events must have been relayed first (``drain``).
        """
        gone: list[int] = []
        for block in reversed(self.announced.pop(request_id, [])):
            owners = self.owners.get(block)
            if owners is None:
                continue  # sealed meanwhile
            owners.discard(request_id)
            if not owners:
                del self.owners[block]
                gone.append(block)
        if gone:
            self.publisher.publish_removed([signed64(h) for h in gone])

    def relay(self, event: dict[str, Any]) -> None:
        """Publish one of the block manager's events (``get_kv_cache_events``) under the router's hashes, unless
        the router has the block already.

        Arguments:
            event: the event, in the LLM API's dict form.
        """
        data = event["data"]
        if data["type"] == "stored":
            parent_key = data.get("parent_hash")
            for block in data["blocks"]:
                self._sealed(int(block["block_hash"]), None if parent_key is None else int(parent_key),
                             [int(token["token_id"]) for token in block["tokens"]])
                parent_key = block["block_hash"]
        elif data["type"] == "removed":
            gone = [h for key in data["block_hashes"] if (h := self._evicted(int(key))) is not None]
            if gone:
                self.publisher.publish_removed([signed64(h) for h in gone])

    def drain(self, llm: EventSource) -> None:
        """Relay every event the LLM holds now.

        Arguments:
            llm: the worker's CPU ``LLM``.
        """
        for event in llm.get_kv_cache_events():
            self.relay(event)

    def _sealed(self, key: int, parent_key: int | None, token_ids: list[int]) -> None:
        if parent_key is not None and parent_key not in self.sequence_hashes:
            return  # its parent was evicted first: the router would refuse the block
        parent = None if parent_key is None else self.sequence_hashes[parent_key]
        block = sequence_hash(parent, token_ids)
        self.sequence_hashes[key] = block
        if not self.is_published(block):
            self._stored(token_ids, block, parent)
        self.num_sealed[block] = self.num_sealed.get(block, 0) + 1
        for request_id in self.owners.pop(block, set()):
            self.announced[request_id].remove(block)

    def _evicted(self, key: int) -> int | None:
        """The sequence hash to publish as removed now that block manager hash ``key`` is handed out, if any."""
        block = self.sequence_hashes.pop(key, None)
        if block is None:
            return None
        self.num_sealed[block] -= 1
        if self.num_sealed[block]:
            return None
        del self.num_sealed[block]  # no request owns a sealed block: sealing took it from its owners
        return block

    def _stored(self, token_ids: list[int], block: int, parent: int | None) -> None:
        self.publisher.publish_stored(token_ids, [len(token_ids)], [signed64(block)],
                                      None if parent is None else signed64(parent))


async def relay_events(llm: EventSource, blocks: RouterBlocks) -> None:
    """Relay the LLM's KV cache events every ``POLL_S`` until cancelled.

    Arguments:
        llm: the worker's CPU ``LLM``; blocks: what the router holds for the worker.
    """
    while True:
        blocks.drain(llm)
        await asyncio.sleep(POLL_S)
