"""``plan --speculative``: the verify step's tokens (max_num_tokens grows by K per sequence in generation) and a
draft model's weights and KV bytes per token on every rank, once per copy the served build loads (the cpu target's
draft-target build: two)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config

PLAN = ["--target", "engine", "--gpu", "H100-80GB", "--max-batch-size", "8", "--max-seq-len", "1024", "--json"]


def plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / "out"), *PLAN, *flags]) == 0
    return dict(json.loads(capsys.readouterr().out)["plan"])


def test_a_draft_model_adds_its_weights_kv_and_the_verify_tokens(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    draft = builtin_dir("tiny-qwen2")
    plain = plan(tmp_path, capsys)
    speculative = plan(tmp_path, capsys, "--speculative", "draft-target", "--draft-model", str(draft),
                       "--max-draft-len", "4")
    hf = read_hf_config(draft)
    assert speculative["max_num_tokens"] == plain["max_num_tokens"] + 8 * 4
    before, after = plain["ranks"][0], speculative["ranks"][0]
    assert after["weight_bytes"] - before["weight_bytes"] == hf.num_parameters * 2  # bfloat16
    assert after["kv_bytes_per_token"] - before["kv_bytes_per_token"] == \
        2 * hf.num_hidden_layers * hf.num_key_value_heads * hf.head_dim * 2


def test_the_cpu_target_counts_the_draft_twice_as_its_served_build_loads_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A served cpu draft-target build loads the draft in ``tensorrt_llm_draft`` (the BLS's) and in
    ``tensorrt_llm``'s own draft engine, each with a pool of the target's tokens: twice the engine target's one."""
    flags = ["--speculative", "draft-target", "--draft-model", str(builtin_dir("tiny-qwen2")), "--max-draft-len", "4"]
    added = {}
    for target in ("engine", "cpu"):
        target_flags = ["--target", target, *PLAN[2:]]
        assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / target), *target_flags]) == 0
        plain = json.loads(capsys.readouterr().out)["plan"]["ranks"][0]
        assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / target), *target_flags, *flags]) == 0
        drafted = json.loads(capsys.readouterr().out)["plan"]["ranks"][0]
        added[target] = (drafted["weight_bytes"] - plain["weight_bytes"],
                         drafted["kv_bytes_per_token"] - plain["kv_bytes_per_token"])
    assert added["engine"][0] > 0 and added["engine"][1] > 0
    assert added["cpu"] == (2 * added["engine"][0], 2 * added["engine"][1])


def test_lookahead_adds_only_the_verify_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = plan(tmp_path, capsys)
    speculative = plan(tmp_path, capsys, "--speculative", "lookahead")
    assert speculative["max_num_tokens"] == plain["max_num_tokens"] + 8 * 15
    assert speculative["ranks"][0]["weight_bytes"] == plain["ranks"][0]["weight_bytes"]
    assert speculative["ranks"][0]["kv_bytes_per_token"] == plain["ranks"][0]["kv_bytes_per_token"]


@pytest.mark.parametrize("target", ["llmapi", "cpu"])
def test_prompt_lookup_plans_for_a_gpu_on_the_targets_that_run_it(target: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """n-gram has no trtllm-build flags: planning it for a GPU on a target that runs it adds the verify tokens and
    names no engine mode."""
    flags = ["--target", target, "--gpu", "H100-80GB", "--max-batch-size", "8", "--max-seq-len", "1024", "--json"]
    assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / "plain"), *flags]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / "ngram"), *flags, "--speculative", "ngram",
                "--max-draft-len", "4"]) == 0
    ngram = json.loads(capsys.readouterr().out)
    assert not any("--speculative_decoding_mode" in command for command in ngram["commands"])
    if target == "llmapi":  # the LLM API's options carry the speculation; there is no trtllm-build plan
        assert ngram["llmapi"]["llm_args"]["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4}
    else:
        assert ngram["plan"]["max_num_tokens"] == plain["plan"]["max_num_tokens"] + 8 * 4


def test_the_plan_predicts_the_speedup_from_the_drafts_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = builtin_dir("tiny-qwen2")
    flags = ["--speculative", "draft-target", "--draft-model", str(draft), "--max-draft-len", "4", "--json"]
    assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / "out"), *PLAN, *flags]) == 0
    report = json.loads(capsys.readouterr().out)["speculation"]
    cost = read_hf_config(draft).num_parameters / read_hf_config(builtin_dir("tiny-llama")).num_parameters
    assert 0.8 < cost < 0.9  # a draft nearly the target's size
    batch_1 = {f"{n:g}": round(n / (1 + 4 * cost), 3) for n in (1.5, 2.0, 3.0, 4.0)}
    assert {key: value for key, value in report.items() if key != "roofline"} == {
        "draft_len": 4, "draft_cost": round(cost, 4), "break_even_acceptance_length": round(1 + 4 * cost, 4),
        "predicted_speedup": batch_1}
    # on the H100 (knee 295 tokens) 16 x 5 verified tokens stay memory-bound: batch 1's speedup at 4 and 16, and
    # every length up to 4 is below 1 + 4 c, so speculation loses from batch 1
    roofline = report["roofline"]
    assert roofline["predicted_speedup_by_batch_size"] == {"1": batch_1, "4": batch_1, "16": batch_1}
    assert roofline["stops_paying_at_batch_size"] == {"1.5": 1, "2": 1, "3": 1, "4": 1}


def test_prompt_lookup_costs_no_draft_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--target", "cpu", "--speculative", "ngram", "--max-draft-len", "2", "--json"]
    assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / "out"), *flags]) == 0
    report = json.loads(capsys.readouterr().out)["speculation"]
    assert report == {"draft_len": 2, "draft_cost": 0.0, "break_even_acceptance_length": 1.0,
                      "predicted_speedup": {"1.5": 1.5, "2": 2.0, "3": 3.0}}  # no length past K + 1 = 3
