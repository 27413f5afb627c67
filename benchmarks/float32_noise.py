"""How far float32 logits sit from float64, for transformers and the kit's CPU runtime, on verify's default prompts:
the figures verify's float32 tolerance (``checkpoint/verify.FP32_REL_TOL``) is set from.

    python benchmarks/float32_noise.py [--models smollm2-135m-instruct,tiny-llama,tiny-qwen2,tiny-mistral] [--json]

For each built-in model, converted to a float32 checkpoint, the largest |logit difference| over verify's default
prompts (1, 5, 16 and 37 tokens), one torch thread:

* transformers in float32 against transformers in float64 (the reference's own float32 noise);
* the runtime as it runs (products of two rows or more on oneDNN's packed weights, ``runtime/products.py``) and with
  MKL's product everywhere (the packed copies dropped), each against float64 and against transformers in float32
  (what verify compares);
* the runtime with the final norm 0.1% off, against transformers in float32 (a small bug verify must still see);

beside the logit scale (max |float64 logit|) and the tolerance verify holds float32 to at that scale.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.checkpoint.verify import default_prompts, tolerance_for
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.products import PACKED

MODELS = ("smollm2-135m-instruct", "tiny-llama", "tiny-qwen2", "tiny-mistral")
FINAL_NORM = "transformer.ln_f.weight"


def largest(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest |a - b| over every prompt's logits, in float64."""
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True))


def drop_packed(model: CheckpointModel) -> None:
    """The model's packed copies removed, so that every product is MKL's."""
    for pp_rank in range(model.dims.pp_size):
        for tp_rank in range(model.dims.tp_size):
            weights = model.weights(pp_rank, tp_rank)
            for name in [n for n in weights if n.endswith(PACKED)]:
                del weights[name]
    model.gate_up_packed.clear()


def measure(name: str, work: Path) -> dict[str, float]:
    """The figures of one model (see the module)."""
    from transformers import AutoModelForCausalLM

    hf_dir = builtin_dir(name)
    convert_checkpoint(hf_dir, work / name, dtype="float32")
    kit = CheckpointModel.load(work / name)
    prompts = [torch.tensor([p]) for p in default_prompts(kit.dims.vocab_size)]
    with torch.no_grad():
        answers = {}
        for dtype in (torch.float64, torch.float32):
            hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).eval()
            answers[dtype] = [hf(ids).logits[0] for ids in prompts]
            del hf
        packed = [kit.forward(ids)[0] for ids in prompts]
        drop_packed(kit)
        mkl = [kit.forward(ids)[0] for ids in prompts]
        kit.weights(kit.dims.pp_size - 1, 0)[FINAL_NORM].mul_(1.001)  # one rank: the last stage holds it
        off = [kit.forward(ids)[0] for ids in prompts]
    f64, f32 = answers[torch.float64], answers[torch.float32]
    scale = max(x.abs().max().item() for x in f64)
    return {"logit_scale": scale, "transformers_fp32_vs_fp64": largest(f32, f64),
            "kit_packed_vs_fp64": largest(packed, f64), "kit_packed_vs_transformers": largest(packed, f32),
            "kit_mkl_vs_fp64": largest(mkl, f64), "kit_mkl_vs_transformers": largest(mkl, f32),
            "final_norm_off_vs_transformers": largest(off, f32), "tolerance": tolerance_for("float32", scale)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated built-in model names")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        figures = {name: measure(name, Path(tmp)) for name in args.models.split(",")}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, f in figures.items():
        scale = f["logit_scale"]
        print(f"{name:24s} logit scale {scale:6.2f} | transformers fp32 vs fp64 {f['transformers_fp32_vs_fp64']:.2e} | "
              f"kit packed vs fp64 {f['kit_packed_vs_fp64']:.2e}, vs transformers fp32 "
              f"{f['kit_packed_vs_transformers']:.2e} ({f['kit_packed_vs_transformers'] / scale:.1e} of the scale) | "
              f"kit MKL vs fp64 {f['kit_mkl_vs_fp64']:.2e}, vs transformers fp32 {f['kit_mkl_vs_transformers']:.2e} | "
              f"final norm 0.1% off {f['final_norm_off_vs_transformers']:.2e} | verify's tolerance "
              f"{f['tolerance']:.2e}")


if __name__ == "__main__":
    main()
