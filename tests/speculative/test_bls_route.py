"""The frontend's route choice for a speculating artifact (``serve/openai/bls_route.py``): the BLS with
``num_draft_tokens`` for draft-target on the engine target alone, the direct route for every other target and mode;
the BLS route's client counting drafts and tokens from the BLS's cumulative outputs (``serve/openai/bls_client.py``).
Served for real: ``test_bls_route_served.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.openai.bls_client import BlsClient, Rounds
from trtllm_kit.serve.openai.bls_route import bls_num_draft_tokens
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.openai.text import Tokenizer
from trtllm_kit.spec.speculative import DEFAULT_MAX_DRAFT_LEN, NEEDS_DRAFT_DIR, Speculation, SpeculativeOptions
from trtllm_kit.targets import TARGETS
from trtllm_kit.wire import DraftAcceptance, GenerationResponse

MODES = [None, *Speculation]


def options(mode: Speculation | None, max_draft_len: int) -> SpeculativeOptions:
    """The table of ``mode`` with a draft length of ``max_draft_len`` where the mode takes one."""
    return SpeculativeOptions(mode=mode, draft_model=Path("draft") if mode in NEEDS_DRAFT_DIR else None,
                              max_draft_len=None if mode in (None, Speculation.LOOKAHEAD) else max_draft_len)


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: str(mode))
def test_only_an_engine_draft_target_build_goes_through_the_bls(target: str, mode: Speculation | None) -> None:
    expected = 5 if (target, mode) == ("engine", Speculation.DRAFT_TARGET) else None
    assert bls_num_draft_tokens(target, options(mode, 5)) == expected


def test_the_bls_is_sent_the_default_draft_length_when_none_is_given() -> None:
    assert bls_num_draft_tokens("engine", SpeculativeOptions(mode=Speculation.DRAFT_TARGET)) == DEFAULT_MAX_DRAFT_LEN


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(builtin_dir("tiny-llama"))


def test_a_bls_route_sends_text_through_its_bls_client(tokenizer: Tokenizer) -> None:
    models = ("tensorrt_llm_bls", "tensorrt_llm", "tensorrt_llm_draft")
    direct = Route("m", "tensorrt_llm_bls", models=models, tokenizer=tokenizer)
    bls = Route("m", "tensorrt_llm_bls", models=models, tokenizer=tokenizer, num_draft_tokens=3)
    assert direct.tokenizes and not bls.tokenizes

    async def open_both() -> tuple[object, object]:
        direct.open("127.0.0.1:1", ())
        bls.open("127.0.0.1:1", ())
        return direct.client, bls.client

    direct_client, bls_client = asyncio.run(open_both())
    assert type(direct_client) is TextClient
    assert isinstance(bls_client, BlsClient) and bls_client.num_draft_tokens == 3
    assert bls_client.model == "tensorrt_llm_bls" and bls_client.tokenizer is tokenizer


def test_the_rounds_count_drafts_where_the_draft_tokens_grew_and_tokens_by_the_text(tokenizer: Tokenizer) -> None:
    rounds = Rounds(tokenizer)
    texts = ["Hello", " world,", " again", ""]
    figures = [(3, 2), (6, 2), (6, 2), (6, 2)]  # cumulative; the last two rounds drafted nothing
    read = [rounds.read(GenerationResponse(texts=(text,)), *pair) for text, pair in zip(texts, figures, strict=True)]
    assert [r.draft_acceptance for r in read] == [DraftAcceptance(1, 3, 2), DraftAcceptance(2, 6, 2),
                                                  DraftAcceptance(2, 6, 2), DraftAcceptance(2, 6, 2)]
    so_far = ["Hello", "Hello world,", "Hello world, again", "Hello world, again"]
    assert [r.num_output_tokens for r in read] == [len(tokenizer.hf.encode(t, add_special_tokens=False))
                                                   for t in so_far]
    assert [r.text for r in read] == texts
    assert rounds.read(GenerationResponse(texts=("!",)), None, None).draft_acceptance is None  # no figures sent


def test_without_a_tokenizer_the_rounds_keep_the_reported_count() -> None:
    read = Rounds(None).read(GenerationResponse(texts=("a",), num_output_tokens=None), 2, 1)
    assert read.num_output_tokens is None and read.draft_acceptance == DraftAcceptance(1, 2, 1)
