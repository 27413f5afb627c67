"""The real ``lm-eval`` through the served model equals ``lm-eval --model hf`` on the model itself: the two local
tasks of ``tests/data/eval`` (loglikelihood and multiple choice), per request within 1e-3, with the same accuracy
(``benchmarks/eval_parity.py`` against a float32 cpu build of ``builtin:tiny-llama``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "eval"


@pytest.fixture(scope="module")
def parity(served32: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(task, run) → that run's figures, ``hf`` and ``served float32``."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_parity.py"), "--base-url",
                           f"http://{served32['openai']}/v1", "--no-fp8", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {(f["task"], f["run"]): f for f in json.loads(done.stdout)}


def ending_docs() -> set[int]:
    """The samples after which the model's greedy next token is its end-of-sequence token."""
    lines = (DATA / "last_word.jsonl").read_text().splitlines()
    return {i for i, line in enumerate(lines) if json.loads(line).get("model_ends_after")}


def test_every_sample_is_scored_as_by_transformers(parity: dict[tuple[str, str], dict[str, Any]]) -> None:
    for task, num_requests in (("kit_last_word", 30), ("kit_word_choice", 120)):
        served = parity[task, "served float32"]
        assert served["num_requests"] == parity[task, "hf"]["num_requests"] == num_requests
        assert {doc for doc, *_ in served["mismatched"]} <= ending_docs(), served["mismatched"]
    choice = parity["kit_word_choice", "served float32"]
    assert choice["max_abs_difference"] <= 1e-3
    assert choice["accuracy"] == parity["kit_word_choice", "hf"]["accuracy"]
    assert 0 < choice["accuracy"]["acc"] < 1 and choice["accuracy"]["acc"] != choice["accuracy"]["acc_norm"]


def test_a_continuation_the_model_would_end_after_is_scored(
        parity: dict[tuple[str, str], dict[str, Any]]) -> None:
    """lm-eval asks for one token beyond the continuation and drops it; when the model's next token is its EOS,
    that token must still come back (prompt + 1 entries), or the continuation's own logprob is dropped."""
    served = parity["kit_last_word", "served float32"]
    assert served["mismatched"] == [] and served["max_abs_difference"] <= 1e-3
    assert served["accuracy"] == parity["kit_last_word", "hf"]["accuracy"]
    assert 0 < served["accuracy"]["acc"] < 1
