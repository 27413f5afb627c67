"""What each quantization format costs in quality on a real trained model: for every format the kit builds, the
checkpoint's bytes, its perplexity on the shipped English corpus and the change against the unquantized model, and
its accuracy on the shipped multiple-choice set and the change; beside FP8, NVFP4 and INT4 AWQ, NVIDIA ModelOpt's
fake-quantized model (its default config for the format, calibrated on the same token windows) on the same data, and
ModelOpt's FP8 with per-channel weight scales (static per-tensor or dynamic per-token activations), which the kit
does not build.

    python benchmarks/quant_quality.py [--model builtin:smollm2-135m-instruct] [--formats fp8,nvfp4] [--json]
                                       [--plot docs/img/quant_quality.png] [--workdir DIR] [--no-kit|--no-modelopt]

Each kit row is ``trtllm-kit build MODEL --target T --quant Q --until checkpoint --no-verify`` (the format's
target: the TensorRT-LLM checkpoint of the cpu target for INT8 and FP8, the llmapi target's unified checkpoint for
NVFP4 and INT4 AWQ; the checkpoint dtype is the build's default, float16 for this float32 model), run by the kit's
CPU runtime computing in float32. The reference is transformers on the unquantized model in float32. Perplexity:
``checkpoint/verify.py``'s windows of the held-out text (2,048 tokens of ``trtllm_kit/data/heldout.txt``, original
prose written for the kit); accuracy: ``trtllm_kit/data/choices.txt`` (40 questions written for the kit, 2.5 points
each). The kit calibrates on the other text, ``trtllm_kit/data/corpus.txt`` (seeded windows), as ModelOpt does
here. A failed build is a row with its error. With ``--workdir`` each row is kept there and a later run computes
only the rows it lacks.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.checkpoint.heldout import corpus_scores, corpus_windows
from trtllm_kit.checkpoint.quality import ChoiceScores, choice_scores, load_questions
from trtllm_kit.checkpoint.reference import tree_forward
from trtllm_kit.llmapi.load import load_unified, unified_loader
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.models.inspect import resolve_model_path
from trtllm_kit.models.text_tokenizer import load_text_tokenizer
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calib_data import token_windows
from trtllm_kit.quant.calib_size import calibration_device, choose_size
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.safetensors_io import read_header
from trtllm_kit.spec import build_spec

FORMATS: dict[str, dict[str, Any]] = {  # the build's [build] target and [quant] table per row
    "fp16": {"target": "cpu", "quant": {}},
    "int8-wo": {"target": "cpu", "quant": {"quant": "int8-wo"}},
    "int8-sq": {"target": "cpu", "quant": {"quant": "int8-sq", "per_channel": True, "per_token": True}},
    "fp8": {"target": "cpu", "quant": {"quant": "fp8"}},
    "fp8+fp8kv": {"target": "cpu", "quant": {"quant": "fp8", "kv_cache": "fp8"}},
    "nvfp4": {"target": "llmapi", "quant": {"quant": "nvfp4"}},
    "int4-awq": {"target": "llmapi", "quant": {"quant": "int4-awq"}},
    "int4-awq-g64": {"target": "llmapi", "quant": {"quant": "int4-awq", "awq_group_size": 64}},
}
EXPORTED = ("nvfp4", "int4-awq", "int4-awq-g64")


@dataclass(frozen=True)
class ModelOptRecipe:
    """ModelOpt's config for a row: its name, FP8 KV on top, the kit's --quant whose calibration size it takes,
    and the two changes a row makes to it (the weight quantizer's channel axis, AWQ's block size)."""

    config: str
    quant: str
    kv_fp8: bool = False
    weight_axis: int | None = None
    block_size: int | None = None


MODELOPT = {"fp8": ModelOptRecipe("FP8_DEFAULT_CFG", "fp8"),
            "fp8+fp8kv": ModelOptRecipe("FP8_DEFAULT_CFG", "fp8", kv_fp8=True),
            "fp8-channel": ModelOptRecipe("FP8_DEFAULT_CFG", "fp8", weight_axis=0),
            "fp8-channel-token": ModelOptRecipe("FP8_PER_CHANNEL_PER_TOKEN_CFG", "fp8"),
            "nvfp4": ModelOptRecipe("NVFP4_DEFAULT_CFG", "nvfp4"),
            "int4-awq": ModelOptRecipe("INT4_AWQ_CFG", "int4-awq"),
            "int4-awq-g64": ModelOptRecipe("INT4_AWQ_CFG", "int4-awq", block_size=64)}


@dataclass
class Row:
    """One producer's figures for one format (``error`` instead of figures when it failed)."""

    format: str
    producer: str  # kit or modelopt
    bytes: int | None = None
    perplexity: float | None = None
    perplexity_change: float | None = None  # relative to the unquantized model
    kl_divergence: float | None = None
    accuracy: float | None = None
    accuracy_change: float | None = None  # points
    error: str | None = None


@dataclass(frozen=True)
class Data:
    """The evaluation data and the unquantized model's figures on it."""

    windows: list[list[int]]
    encode: Any
    reference: torch.nn.Module
    perplexity: float
    choices: ChoiceScores


def reference_data(hf_dir: Path) -> Data:
    reference = load_causal_lm(hf_dir, torch.float32).eval()
    windows = corpus_windows(hf_dir)
    encode = load_text_tokenizer(hf_dir).encode
    forward = logits_of(reference)
    ppl, *_ = corpus_scores(forward, forward, windows)
    return Data(windows, encode, reference, ppl, choice_scores(forward, encode, load_questions()))


def logits_of(model: torch.nn.Module) -> Any:
    """A transformers model's float32 logits of whole sequences, or of a token tree given its positions and mask (as
    ``CheckpointModel.forward``)."""
    tree = tree_forward(model)

    def forward(ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> Any:
        return (model(ids).logits if positions is None or mask is None else tree(ids, positions, mask)).float()

    return forward


def scored(row: Row, forward: Any, data: Data) -> Row:
    """``row`` with the perplexity, KL and accuracy of ``forward`` against the reference."""
    ppl, ppl_ref, kl, _ = corpus_scores(forward, logits_of(data.reference), data.windows)
    picks = choice_scores(forward, data.encode, load_questions())
    row.perplexity, row.perplexity_change, row.kl_divergence = ppl, ppl / ppl_ref - 1, kl
    row.accuracy, row.accuracy_change = picks.accuracy, 100 * (picks.accuracy - data.choices.accuracy)
    return row


def kit_row(model: str, fmt: str, workdir: Path, data: Data) -> Row:
    out = workdir / fmt
    settings = FORMATS[fmt]
    run_build(build_spec({}, {"model": model, "out": out, "quant": settings["quant"], "build": {
        "target": settings["target"], "until": "checkpoint", "verify": False}}))
    ckpt = out / "checkpoint"
    runtime = (unified_loader(ckpt) or (lambda dtype: CheckpointModel.load(ckpt, dtype)))(torch.float32)
    return scored(Row(fmt, "kit", bytes=weight_bytes(ckpt)), runtime.forward, data)


def weight_bytes(ckpt: Path) -> int:
    """The weights' bytes as served: the checkpoint's tensors, except that a W8A16 checkpoint (which holds
    model-dtype weights for trtllm-build to quantize) counts its layers' matrices at one byte an element."""
    config = json.loads((ckpt / "config.json").read_text())
    is_w8a16 = (config.get("quantization") or {}).get("quant_algo") == "W8A16"
    total = 0
    for file in ckpt.glob("*.safetensors"):
        for name, entry in read_header(file).items():
            start, end = entry["data_offsets"]
            matrix = is_w8a16 and ".layers." in name and len(entry["shape"]) == 2
            total += math.prod(entry["shape"]) if matrix else end - start
    return total


def modelopt_row(hf_dir: Path, fmt: str, workdir: Path, data: Data) -> Row:
    """ModelOpt's model for the format: fake-quantized (FP8), or, where its fake quantization needs CUDA (NVFP4's
    dynamic blocks) or a search (AWQ), its ``export_hf_checkpoint`` run by the kit's CPU runtime."""
    import modelopt.torch.quantization as mtq

    recipe = MODELOPT[fmt]
    quant = QuantConfig(quant=recipe.quant)
    size = choose_size(quant, calibration_device())
    windows = token_windows(hf_dir, QuantConfig(quant=quant.quant, calib_samples=size.samples,
                                                calib_seq_len=size.seq_len))
    model = load_causal_lm(hf_dir, torch.float32).eval()
    config = copy.deepcopy(getattr(mtq, recipe.config))
    for entry in config["quant_cfg"]:
        if entry["quantizer_name"] == "*weight_quantizer" and recipe.weight_axis is not None:
            entry["cfg"]["axis"] = recipe.weight_axis
        if entry["quantizer_name"] == "*weight_quantizer" and recipe.block_size is not None:
            entry["cfg"]["block_sizes"][-1] = recipe.block_size
    if recipe.kv_fp8:
        config["quant_cfg"] = list(config["quant_cfg"]) + list(copy.deepcopy(mtq.FP8_KV_CFG)["quant_cfg"])

    def forward_loop(module: torch.nn.Module) -> None:
        with torch.no_grad():
            for start in range(0, len(windows), 8):
                module(torch.tensor(windows[start:start + 8]))

    mtq.quantize(model, config, forward_loop)
    if fmt not in EXPORTED:
        return scored(Row(fmt, "modelopt"), logits_of(model), data)
    from modelopt.torch.export import export_hf_checkpoint

    out = workdir / f"modelopt-{fmt}"
    export_hf_checkpoint(model, export_dir=str(out))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(hf_dir / name, out / name)
    runtime = load_unified(out, Mapping(1, 1), torch.float32)
    return scored(Row(fmt, "modelopt", bytes=sum(p.stat().st_size for p in out.glob("*.safetensors"))),
                  runtime.forward, data)


def row_of(produce: Callable[[], Row], fmt: str, producer: str, workdir: Path) -> Row:
    """The row kept in ``workdir`` from an earlier run, else ``produce()``'s (a failure is a row with its error)."""
    kept = workdir / "rows" / f"{fmt}-{producer}.json"
    if kept.is_file():
        return Row(**json.loads(kept.read_text()))
    try:
        row = produce()
    except Exception as exc:  # one format's failure is that row's figure, not the end of the table
        row = Row(fmt, producer, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(asdict(row)) + "\n")
    return row


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for producer, marker in (("kit", "o"), ("modelopt", "x")):
        chosen = [r for r in rows if r.producer == producer and r.perplexity is not None]
        for axis, key, label in ((axes[0], "perplexity_change", "perplexity change (%)"),
                                 (axes[1], "accuracy_change", "multiple-choice accuracy change (points)")):
            kit_bytes = {r.format: r.bytes for r in rows if r.producer == "kit" and r.bytes}
            xs = [(r.bytes or kit_bytes.get(r.format) or 0) / 1e6 for r in chosen]
            ys = [100 * getattr(r, key) if key == "perplexity_change" else getattr(r, key) for r in chosen]
            axis.scatter(xs, ys, marker=marker, label=producer)
            for x, y, r in zip(xs, ys, chosen, strict=True):
                axis.annotate(r.format, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            axis.set_xlabel("weight MB as served (fake-quantized ModelOpt rows at the kit's size)")
            axis.set_ylabel(label)
            axis.axhline(0, color="grey", linewidth=0.5)
    axes[0].legend()
    figure.suptitle("Quality against bytes: SmolLM2-135M-Instruct, held-out text and multiple-choice set")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--formats", default=",".join(dict.fromkeys([*FORMATS, *MODELOPT])))
    parser.add_argument("--no-modelopt", action="store_true", help="Only the kit's rows.")
    parser.add_argument("--no-kit", action="store_true", help="Only ModelOpt's rows.")
    parser.add_argument("--json", type=Path, help="Write the rows here as JSON.")
    parser.add_argument("--plot", type=Path, help="Write the plot (PNG) here.")
    parser.add_argument("--workdir", type=Path, help="Keep the builds here (default: a temporary directory).")
    args = parser.parse_args()
    torch.manual_seed(0)
    hf_dir = resolve_model_path(args.model)
    data = reference_data(hf_dir)
    print(f"{args.model}: unquantized float32 perplexity {data.perplexity:.4f} over "
          f"{sum(len(w) - 1 for w in data.windows)} tokens, accuracy {data.choices.accuracy:.1%} "
          f"on {len(data.choices.picks)} questions")
    rows: list[Row] = []
    with TemporaryDirectory() as temporary:
        workdir = args.workdir or Path(temporary)
        for fmt in args.formats.split(","):
            producers: list[tuple[str, Callable[[], Row]]] = [
                ("kit", partial(kit_row, args.model, fmt, workdir, data)),
                ("modelopt", partial(modelopt_row, hf_dir, fmt, workdir, data))]
            chosen = {"kit": fmt in FORMATS and not args.no_kit, "modelopt": fmt in MODELOPT and not args.no_modelopt}
            for producer, produce in [(p, make) for p, make in producers if chosen[p]]:
                row = row_of(produce, fmt, producer, workdir)
                rows.append(row)
                print(line(row), flush=True)
    for row in rows:  # rows kept from an earlier run: their bytes as this run counts them
        ckpt = workdir_bytes(args.workdir, row)
        if ckpt is not None:
            row.bytes = weight_bytes(ckpt)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "reference_perplexity": data.perplexity,
                                         "reference_accuracy": data.choices.accuracy,
                                         "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    if args.plot:
        plot(rows, args.plot)


def workdir_bytes(workdir: Path | None, row: Row) -> Path | None:
    """The kept checkpoint of a kit row, when ``--workdir`` holds it."""
    ckpt = workdir / row.format / "checkpoint" if workdir is not None and row.producer == "kit" else None
    return ckpt if ckpt is not None and (ckpt / "config.json").is_file() else None


def line(row: Row) -> str:
    if row.error:
        return f"{row.format:<10} {row.producer:<8} failed: {row.error}"
    size = f"{row.bytes / 1e6:7.1f} MB" if row.bytes else "      -   "
    assert row.perplexity is not None and row.perplexity_change is not None and row.accuracy is not None
    return (f"{row.format:<10} {row.producer:<8} {size}  perplexity {row.perplexity:8.4f} "
            f"({100 * row.perplexity_change:+6.2f} %)  KL {row.kl_divergence:.4f}  accuracy {row.accuracy:6.1%} "
            f"({row.accuracy_change:+5.1f} points)" + ("" if math.isfinite(row.perplexity) else "  (not finite)"))


if __name__ == "__main__":
    main()
