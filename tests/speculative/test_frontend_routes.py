"""The route each frontend gets for a speculating artifact, one fact: a plain serve and the fleet send an engine
draft-target build's OpenAI requests through ``tensorrt_llm_bls`` (``bls_num_draft_tokens``); ``serve --dynamo``'s
and ``serve --ray``'s one route (``artifact_route``), which reaches no Triton server, refuses exactly those builds in
one sentence naming the mode, before anything starts (``check_bls_route``), and serves every other build directly.
On the cpu target, where the direct route speculates in ``tensorrt_llm``, their CPU ``LLM`` (``artifact_llm``)
speculates in the same mode: same greedy output, drafts counted."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.cpu_llm import LLM, SamplingParams
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.serve.artifact_llm import artifact_llm, cpu_speculative_config
from trtllm_kit.serve.openai.artifact_route import artifact_route, bls_refusal, check_bls_route
from trtllm_kit.serve.openai.bls_route import bls_num_draft_tokens
from trtllm_kit.spec.speculative import NEEDS_DRAFT_DIR, Speculation, SpeculativeOptions
from trtllm_kit.targets import TARGETS

torch.set_num_threads(1)
MODES = [None, *Speculation]
PROMPT = [1, 415, 565, 37, 902, 11, 415, 565, 37, 902, 11, 415]
K = 3


def options(mode: Speculation | None) -> SpeculativeOptions:
    return SpeculativeOptions(mode=mode, draft_model=Path("draft") if mode in NEEDS_DRAFT_DIR else None,
                              max_draft_len=None if mode in (None, Speculation.LOOKAHEAD) else K)


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: str(mode))
def test_dynamo_and_ray_refuse_exactly_what_a_plain_serve_sends_to_the_bls(target: str, mode: Speculation | None
                                                                           ) -> None:
    through_bls = bls_num_draft_tokens(target, options(mode))  # plain serve and the fleet (fleet/members.py)
    refusal = bls_refusal(Path("out"), target, options(mode))  # serve --dynamo and serve --ray (artifact_route)
    assert (through_bls is not None) == ((target, mode) == ("engine", Speculation.DRAFT_TARGET))
    assert (refusal is not None) == (through_bls is not None)
    if refusal is not None:
        assert refusal == ("out is built with --target engine --speculative draft-target, which speculates through "
                           "tensorrt_llm_bls, and serve --dynamo and serve --ray stream from no Triton server; serve "
                           "it without them: trtllm-kit serve out --openai-port PORT.")


def build(out: Path, *speculative: str) -> Path:
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                *speculative, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("frontend-routes")
    return {"ngram": build(root / "ngram", "--speculative", "ngram", "--max-draft-len", str(K)),
            "draft-target": build(root / "draft", "--speculative", "draft-target", "--draft-model",
                                  str(builtin_dir("tiny-qwen2")), "--max-draft-len", str(K))}


def test_an_engine_draft_target_build_is_refused_before_its_route_is_made(builds: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    # the route is data: the cpu build's manifest, its target named engine (no engine is needed to refuse it)
    manifest = json.loads((builds["draft-target"] / "manifest.json").read_text())
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "manifest.json").write_text(json.dumps({**manifest, "target": "engine"}))
    message = (f"{engine} is built with --target engine --speculative draft-target, which speculates through "
               "tensorrt_llm_bls, and serve --dynamo and serve --ray stream from no Triton server; serve it without "
               f"them: trtllm-kit serve {engine} --openai-port PORT.")
    for refuse in (lambda: check_bls_route(engine), lambda: artifact_route(engine, "tiny", "dynamo")):
        with pytest.raises(KitUsageError) as caught:
            refuse()
        assert str(caught.value) == message


@pytest.mark.parametrize("mode", ["ngram", "draft-target"])
def test_a_cpu_build_is_served_directly_and_its_llm_speculates_in_the_same_mode(builds: dict[str, Path],
                                                                                mode: str) -> None:
    out = builds[mode]
    artifact = Artifact.read(out)
    check_bls_route(out)
    route = artifact_route(out, "tiny", "dynamo")
    assert route.num_draft_tokens is None and route.models == ("dynamo",)
    config = cpu_speculative_config(artifact)
    expected: dict[str, Any] = {"decoding_type": "NGram", "max_draft_len": K} if mode == "ngram" else {
        "decoding_type": "DraftTarget", "max_draft_len": K, "speculative_model_dir": str(out / "draft_checkpoint")}
    assert config == expected
    reference, _ = greedy(LLM(model=str(out / "checkpoint"), max_seq_len=256))
    llm, _limits = artifact_llm(out)
    tokens, acceptance = greedy(llm)
    assert tokens == reference
    assert acceptance is not None and acceptance.num_drafts > 0 and acceptance.num_draft_tokens > 0


def test_a_cpu_build_without_speculation_gives_its_llm_none(builds: dict[str, Path], tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(builds["ngram"], plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    manifest["spec"]["speculative"] = {}  # the table left out
    (plain / "manifest.json").write_text(json.dumps(manifest))
    assert cpu_speculative_config(Artifact.read(plain)) is None


def greedy(llm: LLM) -> tuple[list[int], Any]:
    """The greedy completion of ``PROMPT`` (32 tokens) and its draft counts; the LLM is shut down."""
    async def go() -> Any:
        return (await llm.generate_async(PROMPT, SamplingParams(max_tokens=32, temperature=0.0)).aresult()).outputs[0]
    try:
        output = asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        llm.shutdown()
    return list(output.token_ids), output.draft_acceptance
