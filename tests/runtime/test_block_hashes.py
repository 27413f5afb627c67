"""Block hashes are the same in every process: two workers that compute one prefix publish it under the same
hashes (Dynamo's KV router keeps one name per block, and refuses a second worker's later blocks under another)."""

from __future__ import annotations

import subprocess
import sys

HASHES = """
from trtllm_kit.runtime.block_manager import BlockManager
from trtllm_kit.runtime.sequence import SamplingParams, Sequence

manager = BlockManager(num_blocks=4, tokens_per_block=4, enable_reuse=True)
manager.record_events(16)
seq = Sequence(0, list(range(100, 108)), SamplingParams(max_tokens=1))
manager.allocate(seq, 8)
seq.num_computed_tokens = 8
manager.seal(seq)
print([(e.block_hash, e.parent_hash) for e in manager.events])
"""


def test_two_processes_hash_one_prefix_alike() -> None:
    runs = [subprocess.run([sys.executable, "-c", HASHES], capture_output=True, text=True, check=True,
                           timeout=300).stdout for _ in range(2)]
    assert runs[0].count("(") == 2  # two stored blocks, the second chained to the first
    assert runs[0] == runs[1]
