"""Calibration throughput on this machine's CPU: tokens/s of the kit's calibration pass (the model streamed one
decoder layer at a time from its safetensors, bfloat16 compute, the amax hooks on every linear layer) on the
built-in models, and what it means for a 7B-class model.

The 7B figure is an extrapolation, not a run of a 7B model: one- and four-layer models of Llama-2-7B's shape
(hidden 4096, intermediate 11008, 32 heads, vocabulary 32000, random weights, float32) are calibrated over the same
windows (the fastest of ``--repeats`` runs, the machine being shared; each written to a temporary directory in
bfloat16 first, as calibration reads it from disk); seconds per token t(L) = a + b·L (a:
embedding and lm_head, b: one decoder layer) give t(32) = t(1) + 31·(t(4) − t(1)) / 3 for the 32 layers of a 7B
model (whose streamed calibration needs one layer's weights, not the model's).

    python benchmarks/calibration.py [--windows 2] [--seq-len 128] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.models.builtin import BUILTIN_MODELS, builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.quant.calib_size import CPU_SAMPLES, CPU_SEQ_LEN, GPU_SAMPLES, GPU_SEQ_LEN
from trtllm_kit.quant.calibrate import collect_stats

LLAMA_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "max_position_embeddings": 4096}
LAYERS_7B = 32


def seconds_per_token(model_path: Path, windows: int, seq_len: int, vocab: int, repeats: int = 1) -> float:
    """Calibrate the model in ``model_path`` over random windows (one warm-up window first); the fastest run's
    seconds per token."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (windows + 1, seq_len), generator=generator).tolist()
    collect_stats(model_path, ids[:1])
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        collect_stats(model_path, ids[1:])
        best = min(best, (time.perf_counter() - started) / (windows * seq_len))
    return best


def llama_7b_shaped(layers: int, directory: Path) -> Path:
    """A Llama model of 7B's shape with ``layers`` decoder layers and random weights, saved in bfloat16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **LLAMA_7B)).to(torch.bfloat16).save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"threads": torch.get_num_threads(), "windows": args.windows, "seq_len": args.seq_len,
                              "load_average_1min": os.getloadavg()[0], "builtin": {}}
    for name in BUILTIN_MODELS:
        hf = read_hf_config(builtin_dir(name))
        t = seconds_per_token(builtin_dir(name), 8, args.seq_len, hf.vocab_size, args.repeats)
        report["builtin"][name] = {"parameters": hf.num_parameters, "tokens_per_s": round(1 / t, 1)}
    vocab = LLAMA_7B["vocab_size"]
    with tempfile.TemporaryDirectory() as work:
        t1 = seconds_per_token(llama_7b_shaped(1, Path(work) / "l1"), args.windows, args.seq_len, vocab, args.repeats)
        t4 = seconds_per_token(llama_7b_shaped(4, Path(work) / "l4"), args.windows, args.seq_len, vocab, args.repeats)
    t32 = t1 + (LAYERS_7B - 1) * (t4 - t1) / 3
    report["llama_7b_shape"] = {"s_per_token_1_layer": round(t1, 5), "s_per_token_4_layers": round(t4, 5),
                                "s_per_token_32_layers_extrapolated": round(t32, 4),
                                "tokens_per_s_extrapolated": round(1 / t32, 2),
                                "formula": "t(32) = t(1) + 31 * (t(4) - t(1)) / 3",
                                "cpu_default_minutes": round(CPU_SAMPLES * CPU_SEQ_LEN * t32 / 60, 1),
                                "gpu_default_on_cpu_hours": round(GPU_SAMPLES * GPU_SEQ_LEN * t32 / 3600, 1)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, row in report["builtin"].items():
            print(f"{name}: {row['parameters'] / 1e6:.1f}M parameters, {row['tokens_per_s']:.0f} tokens/s")
        s = report["llama_7b_shape"]
        load = report["load_average_1min"]
        print(f"Llama-2-7B shape, {report['threads']} threads (load average {load:.1f}), {args.windows} x "
              f"{args.seq_len} tokens: "
              f"{t1 * 1e3:.1f} ms/token with 1 layer, {t4 * 1e3:.1f} ms/token with 4; extrapolated to 32 layers "
              f"({s['formula']}): {t32:.3f} s/token = {1 / t32:.2f} tokens/s; CPU default {CPU_SAMPLES} x "
              f"{CPU_SEQ_LEN} = {s['cpu_default_minutes']} min, GPU default {GPU_SAMPLES} x {GPU_SEQ_LEN} on this CPU "
              f"= {s['gpu_default_on_cpu_hours']} h")
    return report


if __name__ == "__main__":
    main()
