"""Conversion speed and memory: the kit against the raw I/O floor and a naive transformers baseline.

    python benchmarks/convert.py [--preset tinyllama-1.1b] [--tp 2] [--workdir DIR] [--variants a,b,...]

Writes a synthetic Llama-shaped bf16 checkpoint (TinyLlama-1.1B dimensions, 2.2 GB) into a temporary
directory, then converts it at tp=2 three ways, each in a fresh process and into a fresh output directory:

* kit:   ``trtllm_kit.checkpoint.convert.convert`` (streaming, checked, TensorRT-LLM layout)
* floor: read every tensor from the memory-mapped file, split it as tensor parallelism needs (row-parallel
         o_proj/down_proj along dim 1, which costs a copy; the rest along dim 0), append the bytes to the
         rank files
* naive: ``transformers`` ``from_pretrained``, split the state dict, ``safetensors.save_file`` per rank
* kit-fp8, kit-int8-sq: the kit with ``--quant fp8`` / ``--quant int8-sq`` (per-tensor, static activations),
         from calibration statistics computed once beforehand (not part of the conversion time)
* copy:  ``shutil.copyfile`` of every input safetensors file, the index and config.json into a fresh directory:
         the floor of the llmapi export, which writes the same files (``--tp`` does not apply)
* llmapi, llmapi-fp8: the ``--target llmapi`` export, ``trtllm_kit.llmapi.unified.write_unified`` as the build
         calls it (one unsharded unified HF checkpoint), unquantized and with ``--quant fp8`` from the same
         calibration statistics

``--variants`` runs only the named ones (comma-separated), e.g. ``--variants copy,llmapi,llmapi-fp8``; the
ratios whose variants did not run are left out.

Calibration runs once, in its own process: the real forward hooks on the float32 ``transformers`` model, but on
``--calib-samples`` windows of ``--calib-seq-len`` seeded random token ids (the synthetic checkpoint has no
tokenizer, and a full 512 x 512 calibration of a 1.1B model takes long on a CPU). The quantization kernels are
then timed alone (``benchmarks/quant_kernels.py``).

Each prints wall time, input GB/s and peak anonymous memory (RssAnon sampled every 5 ms: the page cache
that memory-mapped reads fill is not counted). Input files are in the page cache for all three (the
generator just wrote them); outputs are not fsync'ed, but every run starts after an ``os.sync()``. Disk
write speed and the machine's other load vary from run to run (by 2–3x on shared machines), so the variants
run ``--repeat`` times, interleaved; the best run of each measures what the code costs (noise only adds
time), the median what a user sees, and both ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from quant_kernels import print_kernel_figures
from run_figures import AnonPeak, Figures, pick

if TYPE_CHECKING:
    from trtllm_kit.quant.algos import QuantConfig
    from trtllm_kit.quant.calibrate import CalibrationStats

ROOT = Path(__file__).resolve().parents[1]


def quantization(src: Path, quant: str) -> tuple[QuantConfig, CalibrationStats | None]:
    """``--quant QUANT``'s configuration and the statistics calibrated beforehand next to ``src`` when it needs them."""
    from trtllm_kit.quant.algos import QuantConfig
    from trtllm_kit.quant.calibrate import CalibrationStats

    config = QuantConfig(quant=quant)
    return config, CalibrationStats.load(src.parent / "calibration") if config.needs_calibration else None


def run_kit(src: Path, dst: Path, tp: int, quant: str = "none") -> None:
    from trtllm_kit.checkpoint.convert import convert_checkpoint

    dst.mkdir()
    config, stats = quantization(src, quant)
    convert_checkpoint(src, dst, tp_size=tp, quant=config, stats=stats)


def run_calibration(src: Path, samples: int, seq_len: int) -> float:
    """Collect statistics with the real hooks on seeded random token ids; save them next to ``src``."""
    import torch

    from trtllm_kit.quant.calibrate import collect_stats

    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    generator = torch.Generator().manual_seed(1234)
    windows = torch.randint(0, vocab, (samples, seq_len), generator=generator).tolist()
    start = time.perf_counter()
    stats = collect_stats(src, windows, device="cpu")
    seconds = time.perf_counter() - start
    stats.save(src.parent / "calibration")
    return seconds


ROW_PARALLEL = ("o_proj.weight", "down_proj.weight")


def run_floor(src: Path, dst: Path, tp: int) -> None:
    import torch
    from safetensors import safe_open

    dst.mkdir()
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    outputs = [(dst / f"rank{r}.bin").open("wb") for r in range(tp)]
    for file in sorted(set(weight_map.values())):
        with safe_open(str(src / file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensor = handle.get_tensor(name)
                dim = 1 if name.endswith(ROW_PARALLEL) else 0
                for out, part in zip(outputs, torch.chunk(tensor, tp, dim=dim), strict=True):
                    out.write(memoryview(part.contiguous().view(torch.uint8).numpy()))
    for out in outputs:
        out.close()


def run_naive(src: Path, dst: Path, tp: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    dst.mkdir()
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    state = model.state_dict()
    for rank in range(tp):
        shards = {name: torch.chunk(t, tp, dim=0)[rank].contiguous().clone() for name, t in state.items()}
        save_file(shards, str(dst / f"rank{rank}.safetensors"))
        del shards


def run_copy(src: Path, dst: Path, tp: int) -> None:
    """The llmapi export's floor: the same files copied as they are (``tp`` is a serving choice there)."""
    dst.mkdir()
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    for file in [*sorted(set(weight_map.values())), "model.safetensors.index.json", "config.json"]:
        shutil.copyfile(src / file, dst / file)


def run_llmapi(src: Path, dst: Path, tp: int, quant: str = "none") -> None:
    """``--target llmapi``'s export as ``LlmapiTarget.write_checkpoint`` calls it (``tp`` only goes into
    model.yaml there, so it does not change the export)."""
    from trtllm_kit.llmapi.unified import write_unified
    from trtllm_kit.models.inspect import inspect_model

    dst.mkdir()
    config, stats = quantization(src, quant)
    write_unified(inspect_model(str(src)), dst, "auto", config, stats, lambda _name, _nbytes: None)


VARIANTS = {"floor": run_floor, "kit": run_kit, "naive": run_naive,
            "kit-fp8": lambda src, dst, tp: run_kit(src, dst, tp, "fp8"),
            "kit-int8-sq": lambda src, dst, tp: run_kit(src, dst, tp, "int8-sq"),
            "copy": run_copy, "llmapi": run_llmapi,
            "llmapi-fp8": lambda src, dst, tp: run_llmapi(src, dst, tp, "fp8")}
CALIBRATED = ("kit-fp8", "kit-int8-sq", "llmapi-fp8")


# Modules each variant needs, imported before the clock starts: the figures compare work, not import time.
IMPORTS = {"floor": ("safetensors",), "naive": ("safetensors.torch", "transformers.models.llama.modeling_llama"),
           "kit": ("trtllm_kit.checkpoint.convert", "trtllm_kit.quant.calibrate"), "copy": ("shutil",),
           "llmapi": ("trtllm_kit.llmapi.unified", "trtllm_kit.models.inspect", "trtllm_kit.quant.calibrate")}


# (slower, faster, target) pairs printed as time ratios when both ran.
RATIOS = (("kit", "floor", " (target <= 1.25x)"), ("naive", "kit", " (target >= 1.8x)"),
          ("kit-fp8", "kit", " (target <= 1.5x)"), ("kit-int8-sq", "kit", ""),
          ("llmapi", "copy", " (target <= 1.1x)"), ("llmapi-fp8", "llmapi", " (target <= 1.3x)"))


def _variant_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(unknown) or '(none)'}; "
                                         f"choose from {', '.join(VARIANTS)}")
    return names


def child(variant: str, src: Path, dst: Path, tp: int, input_bytes: int) -> None:
    """Run one variant in this (fresh) process and print its figures as JSON."""
    import importlib

    import torch  # noqa: F401 (every variant needs it)

    for module in IMPORTS[variant.split("-")[0]]:
        importlib.import_module(module)

    with AnonPeak() as peak:
        start = time.perf_counter()
        VARIANTS[variant](src, dst, tp)
        seconds = time.perf_counter() - start
    print(json.dumps(asdict(Figures(variant, seconds, input_bytes / 1e9, peak.peak_mb))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tinyllama-1.1b")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="Where to write (default: a temp dir).")
    parser.add_argument("--repeat", type=int, default=5, help="Runs of each variant, interleaved.")
    parser.add_argument("--calib-samples", type=int, default=4, help="Calibration windows (random token ids).")
    parser.add_argument("--calib-seq-len", type=int, default=128, help="Tokens per calibration window.")
    parser.add_argument("--variants", type=_variant_list, default=list(VARIANTS),
                        help=f"Comma-separated variants to run (default: all of {','.join(VARIANTS)}).")
    parser.add_argument("--child", nargs=4, metavar=("VARIANT", "SRC", "DST", "BYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    if args.child:
        variant, src, dst, nbytes = args.child
        if variant == "calibrate":
            with AnonPeak() as peak:
                seconds = run_calibration(Path(src), args.calib_samples, args.calib_seq_len)
            print(json.dumps(asdict(Figures(variant, seconds, int(nbytes) / 1e9, peak.peak_mb))))
        else:
            child(variant, Path(src), Path(dst), args.tp, int(nbytes))
        return
    from synthetic_checkpoint import write_checkpoint

    from trtllm_kit.models.inspect import inspect_model

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        src = work / "hf"
        input_bytes = write_checkpoint(src, args.preset)
        largest = max(info.nbytes for info in inspect_model(str(src)).tensors.values())
        print(f"input: {args.preset}, {input_bytes / 1e9:.2f} GB bf16, largest tensor {largest / 2**20:.0f} MiB, "
              f"tp={args.tp}")
        if any(v in CALIBRATED for v in args.variants):
            out = subprocess.run([sys.executable, __file__, "--calib-samples", str(args.calib_samples),
                                  "--calib-seq-len", str(args.calib_seq_len), "--child", "calibrate", str(src), "-",
                                  str(input_bytes)], check=True, capture_output=True, text=True)
            calibration = Figures(**json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"calibration: {calibration.seconds:.1f} s for {args.calib_samples} x {args.calib_seq_len} random "
                  f"tokens (float32 forward with hooks), peak anon {calibration.peak_anon_mb:.0f} MB")
        runs: dict[str, list[Figures]] = {v: [] for v in args.variants}
        for attempt in range(args.repeat):
            for variant in runs:
                out_dir = work / f"out-{variant}-{attempt}"
                os.sync()  # start every run with no dirty pages of the previous one still being written back
                out = subprocess.run([sys.executable, __file__, "--tp", str(args.tp), "--child", variant, str(src),
                                      str(out_dir), str(input_bytes)], check=True, capture_output=True, text=True)
                runs[variant].append(Figures(**json.loads(out.stdout.strip().splitlines()[-1])))
                shutil.rmtree(out_dir)
        for variant, figures in runs.items():
            best, middle = pick(figures, "best"), pick(figures, "median")
            times = ", ".join(f"{f.seconds:.2f}" for f in figures)
            print(f"{variant:>11}: best {best.seconds:5.2f} s ({best.gb_per_s:4.2f} GB/s input), median "
                  f"{middle.seconds:5.2f} s, peak anon {best.peak_anon_mb:5.0f} MB   (runs: {times} s)")
        budget = 2 * largest / 2**20 + 300
        for statistic in ("best", "median"):
            ratios = [f"{a}/{b} {pick(runs[a], statistic).seconds / pick(runs[b], statistic).seconds:.2f}x{target}"
                      for a, b, target in RATIOS if a in runs and b in runs]
            if ratios:
                print(f"{statistic:>6}: " + "; ".join(ratios))
        if "kit" in runs:
            print(f"kit peak anon {pick(runs['kit'], 'best').peak_anon_mb:.0f} MB vs budget {budget:.0f} MB "
                  "(2 x largest tensor + 300 MB)")
        if set(CALIBRATED) & set(runs):
            print_kernel_figures(args.preset)


if __name__ == "__main__":
    main()
