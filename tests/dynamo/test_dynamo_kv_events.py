"""KV cache events: the block manager's, the CPU LLM's dict form, and what the worker hands Dynamo's publisher."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from kit_server import BuildKey, Builds

from trtllm_kit.llmapi.cpu_llm import SamplingParams
from trtllm_kit.runtime.block_manager import BlockManager
from trtllm_kit.runtime.sequence import SamplingParams as RuntimeParams
from trtllm_kit.runtime.sequence import Sequence
from trtllm_kit.serve.artifact_llm import artifact_llm
from trtllm_kit.serve.dynamo.kv_events import EVENT_BUFFER, RouterBlocks, signed64
from trtllm_kit.serve.dynamo.router_hashes import block_hash, prompt_hashes, sequence_hash

U64 = (1 << 64) - 1


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


def _stored(key: int, parent_key: int | None, token_ids: list[int]) -> dict[str, Any]:
    """A block manager's ``stored`` event in the LLM API's dict form."""
    return {"event_id": 0, "data": {"type": "stored", "parent_hash": parent_key, "blocks": [
        {"type": "stored_block", "block_hash": key, "tokens": [{"token_id": t} for t in token_ids]}]}}


def _removed(*keys: int) -> dict[str, Any]:
    return {"event_id": 0, "data": {"type": "removed", "block_hashes": list(keys)}}


A, B, C = [7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]  # three blocks of 4 tokens


def test_prompt_hashes_chain_each_full_block_to_its_parent() -> None:
    first, second = prompt_hashes(A + B + [1, 2], 4)  # the partial block has none
    assert first == sequence_hash(None, A) == block_hash(A)
    assert second == sequence_hash(first, B) != sequence_hash(None, B)
    assert prompt_hashes(C + B, 4)[1] != second  # the same tokens after another prefix


def test_sealed_blocks_are_published_under_sequence_hashes_and_removed_when_handed_out_again() -> None:
    publisher = FakePublisher()
    blocks = RouterBlocks(publisher, 4)
    blocks.relay(_stored((1 << 64) - 2, None, A))  # the block manager's own hashes, unsigned
    blocks.relay(_stored(9, (1 << 64) - 2, B))
    blocks.relay(_removed(9, (1 << 64) - 2))
    first, second = prompt_hashes(A + B, 4)
    assert publisher.calls == [("stored", A, [4], [signed64(first)], None),
                               ("stored", B, [4], [signed64(second)], signed64(first)),
                               ("removed", [signed64(second), signed64(first)])]


def test_blocks_announced_at_arrival_are_not_published_again_when_sealed() -> None:
    publisher = FakePublisher()
    blocks = RouterBlocks(publisher, 4)
    blocks.announce("r1", A + B + [1, 2])
    first, second = prompt_hashes(A + B, 4)
    assert publisher.calls == [("stored", A, [4], [signed64(first)], None),
                               ("stored", B, [4], [signed64(second)], signed64(first))]
    blocks.relay(_stored(101, None, A))
    blocks.relay(_stored(102, 101, B))
    blocks.release("r1")  # its prefill ran: the blocks are the pool's now
    blocks.announce("r2", A + B + [3])  # the router has them
    blocks.release("r2")
    assert len(publisher.calls) == 2
    blocks.relay(_removed(102, 101))  # the pool hands them out again
    assert publisher.calls[2:] == [("removed", [signed64(second), signed64(first)])]


def test_a_request_ended_before_its_prefill_removes_the_blocks_it_alone_announced() -> None:
    publisher = FakePublisher()
    blocks = RouterBlocks(publisher, 4)
    blocks.announce("r1", A + B)
    blocks.announce("r2", A + B + C)  # shares r1's blocks, announces its third
    assert [call[3] for call in publisher.calls] == [[signed64(h)] for h in prompt_hashes(A + B + C, 4)]
    blocks.release("r1")
    assert len(publisher.calls) == 3  # r2 still owns them
    blocks.relay(_stored(101, None, A))  # r2's prefill sealed its first block, then it was cancelled
    blocks.release("r2")
    first, second, third = prompt_hashes(A + B + C, 4)
    assert publisher.calls[3:] == [("removed", [signed64(third), signed64(second)])]
    assert blocks.is_published(first) and not blocks.is_published(second)


def test_a_block_sealed_after_its_parent_was_handed_out_is_not_published() -> None:
    publisher = FakePublisher()
    blocks = RouterBlocks(publisher, 4)
    blocks.relay(_stored(101, None, A))
    blocks.relay(_removed(101))
    blocks.relay(_stored(102, 101, B))  # the router would refuse it: its parent is gone
    blocks.relay(_removed(102))
    assert [call[0] for call in publisher.calls] == ["stored", "removed"]


def test_two_workers_name_a_shared_prefix_alike_so_dynamo_s_index_takes_both() -> None:
    llm = pytest.importorskip("dynamo.llm")
    tokens = [1] + [100 + i % 97 for i in range(4 * 32 - 1)]  # four blocks of 32
    assert [block_hash(tokens[i:i + 32]) for i in range(0, 128, 32)] == llm.compute_block_hash_for_seq(tokens, 32)
    tree = llm.RadixTree()
    for worker_id, keys in ((1, [11, 12, 13, 14]), (2, [21, 22, 23, 24])):  # each block manager's own hashes
        publisher = FakePublisher()
        blocks = RouterBlocks(publisher, 32)
        for index, key in enumerate(keys):
            blocks.relay(_stored(key, keys[index - 1] if index else None, tokens[32 * index:32 * index + 32]))
        for event_id, (_, token_ids, _, (hashed,), parent) in enumerate(publisher.calls):
            data = {"parent_hash": None if parent is None else parent & U64, "blocks": [
                {"block_hash": hashed & U64, "tokens_hash": llm.compute_block_hash_for_seq(token_ids, 32)[0]}]}
            tree.apply_event(worker_id, json.dumps({"event_id": event_id, "data": {"stored": data},
                                                    "dp_rank": 0}).encode())
    deadline = time.monotonic() + 10
    while (scores := tree.find_matches(llm.compute_block_hash_for_seq(tokens, 32)).scores) != \
            {(1, 0): 4, (2, 0): 4} and time.monotonic() < deadline:
        time.sleep(0.05)  # the tree applies events on its own thread
    assert scores == {(1, 0): 4, (2, 0): 4}


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
