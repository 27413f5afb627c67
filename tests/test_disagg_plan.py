"""``plan --disagg``: the modelled prefill:decode ratio for Llama-3 8B (BF16) and 70B (FP8) on H100, checked term
by term against the stated formula, and its direction (long inputs need more prefill workers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.cli import run
from trtllm_kit.disagg_plan import LINK_BYTES_S, MBU, MFU, ROOFLINE, Workload, plan_disagg
from trtllm_kit.gpus import gpu_from_table
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.precision import Precision

CONFIGS = Path(__file__).parent / "data" / "hf-configs"
H100 = gpu_from_table("H100")
MODELS = {"8B": ("meta-llama--Meta-Llama-3-8B", Precision("bfloat16"), 2, 1e12 * 989),
          "70B-FP8": ("meta-llama--Meta-Llama-3-70B", Precision("bfloat16", "FP8", "FP8"), 1, 1e12 * 1979)}
WORKLOADS = {"long-input": (4096, 512), "long-output": (512, 4096)}


def planned(model: str, lengths: tuple[int, int]):
    directory, precision, _, _ = MODELS[model]
    return plan_disagg(read_hf_config(CONFIGS / directory), precision, H100, Workload(*lengths, 1.0, 0.05))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_formula_term_by_term(model, workload):
    isl, osl = WORKLOADS[workload]
    directory, _, weight_item, peak = MODELS[model]
    hf = read_hf_config(CONFIGS / directory)
    plan = planned(model, (isl, osl))
    n = hf.num_parameters
    assert ROOFLINE["H100-80GB"][2 if weight_item == 1 else 1] == peak
    assert plan.weight_bytes == n * weight_item
    assert plan.kv_bytes_per_token == 2 * hf.num_hidden_layers * hf.num_key_value_heads * hf.head_dim * weight_item
    assert plan.flops_per_token == 2 * n + 2 * hf.num_hidden_layers * hf.num_attention_heads * hf.head_dim * isl
    tp = plan.tp_size
    assert plan.prefill_tokens_s == pytest.approx(tp * peak * MFU / plan.flops_per_token, rel=1e-12)
    assert plan.ttft_disagg_s == pytest.approx(isl / plan.prefill_tokens_s +
                                               isl * plan.kv_bytes_per_token / LINK_BYTES_S, rel=1e-12)
    bandwidth = tp * ROOFLINE["H100-80GB"][0] * MBU
    step = (plan.weight_bytes + plan.decode_batch * plan.kv_bytes_per_token * (isl + osl / 2)) / bandwidth
    assert plan.decode_step_s == pytest.approx(step, rel=1e-12) and step <= 0.05
    assert plan.decode_tokens_s == pytest.approx(plan.decode_batch / step, rel=1e-12)
    assert plan.prefill_per_decode == pytest.approx((plan.decode_tokens_s / osl) / (plan.prefill_tokens_s / isl),
                                                    rel=1e-12)
    ratio = plan.prefill_per_decode
    assert (plan.prefill_workers, plan.decode_workers) == ((round(ratio), 1) if ratio >= 1 else (1, round(1 / ratio)))


def test_the_four_ratios_and_their_direction():
    ratios = {(m, w): planned(m, lengths) for m in MODELS for w, lengths in WORKLOADS.items()}
    assert {key: (p.tp_size, p.prefill_workers, p.decode_workers) for key, p in ratios.items()} == {
        ("8B", "long-input"): (1, 1, 1), ("8B", "long-output"): (1, 1, 51),
        ("70B-FP8", "long-input"): (2, 2, 1), ("70B-FP8", "long-output"): (2, 1, 24)}
    for model in MODELS:
        long_input, long_output = ratios[(model, "long-input")], ratios[(model, "long-output")]
        assert long_input.prefill_per_decode > 20 * long_output.prefill_per_decode
        # a 4096-token prefill chunk alone outlasts a 50 ms step: aggregated cannot hold the ITL target
        assert long_input.agg_batch == 0 and long_input.recommendation == "disaggregated"
    assert ratios[("8B", "long-output")].recommendation == "aggregated"


def test_cli_prints_the_formula_and_json(capsys):
    model = str(CONFIGS / "meta-llama--Meta-Llama-3-70B")
    args = ["plan", model, "--gpu", "H100", "--quant", "fp8", "--kv-cache", "fp8", "--disagg", "--isl", "4096",
            "--osl", "512", "--ttft-slo", "1000", "--itl-slo", "50"]
    assert run(args) == 0
    text = capsys.readouterr().out
    assert "modelled (no measurement)" in text and "(D / OSL) / (P / ISL) = 2.127 -> 2P1D" in text
    assert run([*args, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["modelled"] is True and body["workload"]["isl"] == 4096
    assert (body["prefill_workers"], body["decode_workers"], body["recommendation"]) == (2, 1, "disaggregated")
    assert body["prefill_per_decode"] == pytest.approx(planned("70B-FP8", (4096, 512)).prefill_per_decode)


def test_unknown_gpu_and_impossible_itl_are_one_sentence(capsys):
    model = str(CONFIGS / "meta-llama--Meta-Llama-3-8B")
    assert run(["plan", model, "--gpu", "T4", "--disagg"]) == 2
    assert "no roofline figures for T4" in capsys.readouterr().err
    assert run(["plan", model, "--gpu", "H100", "--disagg", "--itl-slo", "1"]) == 2
    assert "no decode batch meets --itl-slo 1 ms" in capsys.readouterr().err
