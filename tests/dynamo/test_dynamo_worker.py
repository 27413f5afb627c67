"""The worker's model: a cpu artifact's TensorRT-LLM checkpoint and an llmapi artifact's unified one on the CPU LLM."""

from __future__ import annotations

import asyncio

import pytest
from kit_server import BuildKey, Builds

from trtllm_kit.errors import CheckpointError
from trtllm_kit.llmapi.cpu_llm import SamplingParams
from trtllm_kit.llmapi.load import load_checkpoint
from trtllm_kit.mapping import Mapping
from trtllm_kit.serve.artifact_llm import artifact_llm
from trtllm_kit.serve.dynamo.kv_events import EVENT_BUFFER

PROMPT_IDS = [1, 264, 333, 84, 534, 332]


def _greedy(out_target: str, kit_builds: Builds) -> tuple[list[int], int]:
    llm, limits = artifact_llm(kit_builds.get(BuildKey.of(target=out_target)), event_buffer=EVENT_BUFFER)

    async def run() -> list[int]:
        result = await llm.generate_async(PROMPT_IDS, SamplingParams(max_tokens=12, temperature=0.0)).aresult()
        return result.outputs[0].token_ids

    try:
        return asyncio.run(run()), limits.max_seq_len
    finally:
        llm.shutdown()


def test_cpu_and_llmapi_artifacts_answer_alike(kit_builds: Builds) -> None:
    cpu, cpu_len = _greedy("cpu", kit_builds)
    llmapi, llmapi_len = _greedy("llmapi", kit_builds)
    assert len(cpu) == 12 and cpu == llmapi
    assert cpu_len == llmapi_len == 1024


def test_a_trtllm_checkpoint_at_another_mapping_is_refused(kit_builds: Builds) -> None:
    ckpt = kit_builds.get(BuildKey.of(target="cpu")) / "checkpoint"
    with pytest.raises(CheckpointError, match=r"is sharded for tp 1 × pp 1, not the tp 2 × pp 1 asked for"):
        load_checkpoint(ckpt, Mapping(2, 1))
