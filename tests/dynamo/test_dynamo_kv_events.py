"""KV cache events: the block manager's, the CPU LLM's dict form, and what the worker hands Dynamo's publisher."""

from __future__ import annotations

import asyncio
from typing import Any

from kit_server import BuildKey, Builds

from trtllm_kit.llmapi.cpu_llm import SamplingParams
from trtllm_kit.runtime.block_manager import BlockManager
from trtllm_kit.runtime.sequence import SamplingParams as RuntimeParams
from trtllm_kit.runtime.sequence import Sequence
from trtllm_kit.serve.artifact_llm import artifact_llm
from trtllm_kit.serve.dynamo.kv_events import EVENT_BUFFER, publish, signed64


class FakePublisher:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def publish_stored(self, token_ids: list[int], num_block_tokens: list[int], block_hashes: list[int],
                       parent_hash: int | None = None) -> None:
        self.calls.append(("stored", token_ids, num_block_tokens, block_hashes, parent_hash))

    def publish_removed(self, block_hashes: list[int]) -> None:
        self.calls.append(("removed", block_hashes))


def test_signed64_keeps_the_bits() -> None:
    assert signed64(5) == 5
    assert signed64((1 << 64) - 1) == -1
    assert signed64(1 << 63) == -(1 << 63)


def test_publish_maps_stored_and_removed() -> None:
    publisher = FakePublisher()
    publish(publisher, {"event_id": 0, "data": {"type": "stored", "parent_hash": None, "blocks": [
        {"block_hash": (1 << 64) - 2, "tokens": [{"token_id": 7}, {"token_id": 8}]}]}})
    publish(publisher, {"event_id": 1, "data": {"type": "stored", "parent_hash": (1 << 64) - 2, "blocks": [
        {"block_hash": 9, "tokens": [{"token_id": 1}]}]}})
    publish(publisher, {"event_id": 2, "data": {"type": "removed", "block_hashes": [9, (1 << 64) - 2]}})
    assert publisher.calls == [("stored", [7, 8], [2], [-2], None), ("stored", [1], [1], [9], -2),
                               ("removed", [9, -2])]


def test_cpu_llm_reports_stored_blocks_chained_by_parent(kit_builds: Builds) -> None:
    llm, limits = artifact_llm(kit_builds.get(BuildKey.of(target="cpu")), event_buffer=EVENT_BUFFER)
    block = limits.tokens_per_block
    prompt = [1] + [100 + i % 97 for i in range(2 * block + 5)]  # two full prompt blocks and a partial one

    async def run() -> None:
        await llm.generate_async(prompt, SamplingParams(max_tokens=2, temperature=0.0)).aresult()

    try:
        asyncio.run(run())
        events = llm.get_kv_cache_events()
        assert llm.get_kv_cache_events() == []  # read once
    finally:
        llm.shutdown()
    stored = [e["data"] for e in events if e["data"]["type"] == "stored"]
    assert len(stored) == 2
    first, second = stored
    assert first["parent_hash"] is None and second["parent_hash"] == first["blocks"][0]["block_hash"]
    assert [t["token_id"] for t in first["blocks"][0]["tokens"]] == prompt[:block]
    assert [t["token_id"] for t in second["blocks"][0]["tokens"]] == prompt[block:2 * block]
    assert all(0 <= d["blocks"][0]["block_hash"] < 1 << 64 for d in stored)
    assert [e["event_id"] for e in events] == list(range(len(events)))


def test_block_manager_records_stored_then_removed_when_a_block_is_handed_out_again() -> None:
    manager = BlockManager(num_blocks=2, tokens_per_block=4, enable_reuse=True)
    assert manager.events is None  # nothing kept unless asked
    manager.record_events(16)
    a = Sequence(0, list(range(8)), RuntimeParams(max_tokens=1))
    manager.allocate(a, 8)
    a.num_computed_tokens = 8
    manager.seal(a)
    manager.free(a)
    b = Sequence(1, list(range(50, 58)), RuntimeParams(max_tokens=1))
    manager.allocate(b, 8)  # no hit: both of a's blocks are handed out again
    assert manager.events is not None
    kinds = [(e.kind, e.token_ids) for e in manager.events]
    assert kinds == [("stored", (0, 1, 2, 3)), ("stored", (4, 5, 6, 7)), ("removed", ()), ("removed", ())]
    first, second, *removed = manager.events
    assert first.parent_hash is None and second.parent_hash == first.block_hash
    assert {e.block_hash for e in removed} == {first.block_hash, second.block_hash}
