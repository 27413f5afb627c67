"""``plan --disagg --phases FILE``: the plan from figures ``bench --phases`` measured, marked measured, checked term
by term against the stated formula; a file that is not a phases.json, and --phases without --disagg, are one
sentence each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.cli import run
from trtllm_kit.disagg_plan import DISAGG_MARGIN, MeasuredPhases, Workload, plan_measured
from trtllm_kit.plan import MAX_NUM_TOKENS

PHASES = {"prefill_batch": 4, "isl": 256, "prefill_tokens_s": 12000.0, "ttft_ms_p50": 80.0,
          "decode_concurrency": 4, "osl": 32, "decode_tokens_s_per_seq": 80.0, "itl_ms_p50": 12.5,
          "kv_transfer_ms_per_request": 25.0, "num_kv_transfers": 26, "spec": {"out": "phases"}}


@pytest.mark.parametrize(("isl", "osl", "itl_s"), [(256, 32, 0.05), (4096, 64, 0.05), (512, 4096, 0.02)])
def test_the_measured_formula_term_by_term(isl, osl, itl_s):
    phases = MeasuredPhases(**{k: v for k, v in PHASES.items() if k != "spec"})
    plan = plan_measured(phases, Workload(isl, osl, 1.0, itl_s))
    step = 1 / 80.0
    assert plan.measured and plan.to_dict()["modelled"] is False
    assert (plan.prefill_tokens_s, plan.decode_batch, plan.decode_step_s) == (12000.0, 4, step)
    assert plan.decode_tokens_s == pytest.approx(4 / step)
    assert plan.ttft_disagg_s == pytest.approx(isl / 12000.0 + 0.025)
    ratio = (plan.decode_tokens_s / osl) / (12000.0 / isl)
    assert plan.prefill_per_decode == pytest.approx(ratio)
    agg_fits = step + min(isl, MAX_NUM_TOKENS) / 12000.0 <= itl_s
    assert plan.agg_batch == (4 if agg_fits else 0)
    agg = osl / (isl / 12000.0 + osl * step / 4) if agg_fits else 0.0
    assert plan.agg_tokens_s_per_gpu == pytest.approx(agg)
    expected = not agg_fits or plan.disagg_tokens_s_per_gpu > agg * (1 + DISAGG_MARGIN)
    assert plan.recommendation == ("disaggregated" if expected else "aggregated")


def test_cli_reads_the_phases_file_and_says_measured(tmp_path: Path, capsys):
    path = tmp_path / "phases.json"
    path.write_text(json.dumps(PHASES))
    args = ["plan", "builtin:tiny-llama", "--disagg", "--phases", str(path), "--isl", "4096", "--osl", "64"]
    assert run(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("measured (bench --phases, one worker as served): ISL 4096, OSL 64")
    assert "prefill P = measured = 12,000 tokens/s" in text and "recommended: disaggregated" in text
    assert run([*args, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["measured"] is True and body["modelled"] is False and body["agg_batch"] == 0


def test_a_bad_phases_file_and_a_missing_disagg_are_one_sentence(tmp_path: Path, capsys):
    path = tmp_path / "phases.json"
    path.write_text(json.dumps({"isl": 3}))
    assert run(["plan", "builtin:tiny-llama", "--disagg", "--phases", str(path)]) == 2
    assert f"{path} is not a phases.json of trtllm-kit bench --phases" in capsys.readouterr().err
    path.write_text(json.dumps({**PHASES, "decode_tokens_s_per_seq": 0}))
    assert run(["plan", "builtin:tiny-llama", "--disagg", "--phases", str(path)]) == 2
    assert "the measured phases hold no positive throughput" in capsys.readouterr().err
    assert run(["plan", "builtin:tiny-llama", "--phases", str(path)]) == 2
    assert "--phases feeds the disaggregation plan; add --disagg." in capsys.readouterr().err
