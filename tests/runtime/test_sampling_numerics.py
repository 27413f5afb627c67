"""A request whose numbers cannot be sampled ends alone with a sentence, its neighbours' tokens are unchanged; a
temperature below 1e-5 is greedy, and the largest seed (2**64 - 1) runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sampling import GREEDY_NUMERICS_ERROR, sample, sampling_error
from trtllm_kit.runtime.sequence import SamplingParams, Sequence

torch.set_num_threads(1)
PROMPT = [5, 17, 99, 3, 42]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root = tmp_path_factory.mktemp("ckpt")
    convert_checkpoint(builtin_dir("tiny-llama"), root, tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(Path(root))


def run(model: CheckpointModel, params: list[SamplingParams]) -> list[Sequence]:
    engine = Executor(model, EngineConfig())
    seqs = [engine.add_request(PROMPT, p) for p in params]
    for _ in range(200):  # bounded: every request ends within max_tokens steps
        if not engine.has_work():
            break
        engine.step()
    return seqs


def test_a_row_that_cannot_be_sampled_gives_none_and_the_others_a_token() -> None:
    seqs = [Sequence(i, [1], SamplingParams(temperature=0.7, top_p=0.9)) for i in range(3)]
    logits = torch.randn(3, 11)
    logits[1, 4] = float("nan")
    tokens = sample(logits, seqs)
    assert tokens[1] is None and all(isinstance(t, int) and 0 <= t < 11 for t in (tokens[0], tokens[2]))


def test_one_bad_sequence_ends_alone_with_an_error(model: CheckpointModel) -> None:
    alone = run(model, [SamplingParams(max_tokens=12, temperature=0.8, top_p=1.0, seed=2**64 - 1)])[0]
    bad = SamplingParams(max_tokens=12, temperature=0.8, top_p=1.0)
    good = SamplingParams(max_tokens=12, temperature=0.8, top_p=1.0, seed=2**64 - 1)
    engine = Executor(model, EngineConfig())
    first, hostile, last = (engine.add_request(PROMPT, p) for p in (good, bad, SamplingParams(max_tokens=12)))
    hostile.params.temperature = float("nan")  # numbers gone wrong after validation: the step must not fail
    for _ in range(200):
        if not engine.has_work():
            break
        engine.step()
    assert hostile.finish_reason == "error" and "not finite" in (hostile.error or "")
    assert first.output_ids == alone.output_ids and first.finish_reason == "length"
    assert last.finish_reason in ("length", "end_id") and last.output_ids
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_nan_logits_under_greedy_decoding_blame_the_weights_not_the_temperature() -> None:
    greedy = Sequence(0, [1], SamplingParams(temperature=0.0))
    assert sample(torch.full((1, 11), float("nan")), [greedy]) == [None]
    assert sampling_error(greedy) == GREEDY_NUMERICS_ERROR
    assert "temperature" not in sampling_error(greedy)
    sampled = Sequence(1, [1], SamplingParams(temperature=0.7, top_p=0.9))
    assert "send a temperature of at least 1e-5" in sampling_error(sampled)


def test_a_temperature_below_the_floor_is_greedy(model: CheckpointModel) -> None:
    greedy, tiny, floor = run(model, [SamplingParams(max_tokens=10, temperature=0.0),
                                      SamplingParams(max_tokens=10, temperature=1e-45, top_p=1e-30),
                                      SamplingParams(max_tokens=10, temperature=1e-5, top_p=1.0)])
    assert tiny.output_ids == greedy.output_ids and tiny.finish_reason == greedy.finish_reason
    assert floor.finish_reason in ("length", "end_id")  # sampled at the smallest temperature: no NaN


@pytest.mark.parametrize(("fields", "message"), [
    ({"seed": 2**64}, "seed must be an integer from 0 to 2**64 - 1, got 18446744073709551616; send one that is, or "
                      "leave seed out."),
    ({"seed": -1}, "seed must be an integer from 0 to 2**64 - 1, got -1; send one that is, or leave seed out."),
    ({"temperature": float("nan")}, "temperature must be a number >= 0, got nan; send one that is, or leave "
                                    "temperature out."),
])
def test_values_no_engine_can_run_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(KitUsageError, match=f"^{re.escape(message)}$"):
        SamplingParams(**fields)
