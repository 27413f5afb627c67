"""HF checkpoint → quantized unified checkpoint: the kit against NVIDIA ModelOpt, and the quantization kernels' rate.

    python benchmarks/quant_vs_modelopt.py [--preset small] [--formats fp8,nvfp4,int4-awq] [--runs 3] [--json]

Writes a synthetic Llama-shaped bf16 checkpoint (``scripts/synthetic_checkpoint.py``, with the built-in tiny-llama's
tokenizer beside it), then for each format runs the whole path, calibration included, ``--runs`` times with the two
producers' turns alternating, each in a fresh process:

* kit:      ``trtllm-kit build DIR --target llmapi --quant FORMAT --until checkpoint --no-verify`` (layer-streamed
            calibration in bfloat16, then the export);
* modelopt: ``AutoModelForCausalLM.from_pretrained(bfloat16)``, ``mtq.quantize`` with the format's default config
            (max calibration; ``awq_lite`` for INT4 AWQ) over the same token windows, ``export_hf_checkpoint``.

Both calibrate on ``--calib-samples`` windows of ``--calib-seq-len`` tokens (the kit's ``token_windows``, so the
same tokens). Each run reports wall time, peak anonymous memory (``RssAnon`` sampled every 5 ms: what the process
allocates) and peak resident memory (``ru_maxrss``, which also counts the mapped pages of the weight files it read,
page cache the kernel can drop); the medians are printed. The machine's other load moves the wall times; turns
alternate so that both producers see the same load on average. ``--workdir`` keeps the synthetic model for the
next run.

The kernels are timed alone over a seeded 4096 x 4096 bf16 weight, at 1 and 2 threads (row ranges on a thread
pool), beside a plain copy of the same tensor: GB/s of input per core (the FP8 cast and the NVFP4 block quantizer),
the best of 5 after an untimed warm-up.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = {"fp8": "FP8_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG", "int4-awq": "INT4_AWQ_CFG"}

RUNNER = """
import json, resource, subprocess, sys, time
def anon_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("RssAnon"))
    except (OSError, StopIteration):
        return 0
started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
peak_anon = 0
while child.poll() is None:
    peak_anon = max(peak_anon, anon_kb(child.pid))
    time.sleep(0.005)
stderr = child.stderr.read()
print(json.dumps({"rc": child.returncode, "seconds": time.perf_counter() - started, "stderr": stderr[-2000:],
                  "peak_anon_kb": peak_anon, "peak_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

MODELOPT = """
import copy, sys, warnings
warnings.filterwarnings("ignore")
from pathlib import Path
import torch
import modelopt.torch.export as export
import modelopt.torch.quantization as mtq
from transformers import AutoModelForCausalLM
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calib_data import token_windows

model_dir, out, config_name, samples, seq_len = sys.argv[1:6]
windows = token_windows(Path(model_dir), QuantConfig(quant="fp8", calib_samples=int(samples),
                                                     calib_seq_len=int(seq_len)))
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)

def forward_loop(module):
    with torch.no_grad():
        for start in range(0, len(windows), 8):
            module(torch.tensor(windows[start:start + 8]))

mtq.quantize(model, copy.deepcopy(getattr(mtq, config_name)), forward_loop)
export.export_hf_checkpoint(model, export_dir=out)
"""


@dataclass
class PathFigures:
    """Medians of one producer's runs for one format."""

    format: str
    producer: str
    runs: int
    seconds: float
    peak_anon_gb: float  # anonymous memory (RssAnon sampled every 5 ms): what the process itself allocates
    peak_rss_gb: float   # ru_maxrss: also the mapped pages of the weight files it read (page cache)


@dataclass
class KernelFigures:
    """One kernel's rate over one weight."""

    kernel: str
    threads: int
    gb_per_s_per_core: float


def synthetic_model(workdir: Path, preset: str) -> Path:
    """The synthetic checkpoint with a tokenizer (the built-in tiny-llama's; its ids fit every preset's vocab)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from synthetic_checkpoint import write_checkpoint

    from trtllm_kit.models.builtin import builtin_dir

    model = workdir / "model"
    if not (model / "config.json").is_file():  # an earlier run's, in --workdir
        write_checkpoint(model, preset)
    source = builtin_dir("tiny-llama")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, model / name)
    return model


def one_run(argv: list[str]) -> tuple[float, float, float]:
    """(seconds, peak anonymous GB, peak resident GB) of ``argv`` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(done.stdout.splitlines()[-1])
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed ({result['rc']}): {result['stderr']}")
    return result["seconds"], result["peak_anon_kb"] / 1e6, result["peak_rss_kb"] / 1e6


def compare(model: Path, workdir: Path, fmt: str, runs: int, samples: int, seq_len: int) -> list[PathFigures]:
    """Alternating turns of the kit and ModelOpt on one format."""
    kit = [sys.executable, "-m", "trtllm_kit", "build", str(model), "--target", "llmapi", "--quant", fmt,
           "--until", "checkpoint", "--no-verify", "--calib-samples", str(samples), "--calib-seq-len",
           str(seq_len), "--force", "--out"]
    modelopt = [sys.executable, "-c", MODELOPT, str(model)]
    figures: dict[str, list[tuple[float, float, float]]] = {"kit": [], "modelopt": []}
    for turn in range(runs):
        order = ("kit", "modelopt") if turn % 2 == 0 else ("modelopt", "kit")
        for producer in order:
            out = workdir / f"{producer}-{fmt}-{turn}"
            argv = [*kit, str(out)] if producer == "kit" else \
                [*modelopt, str(out), FORMATS[fmt], str(samples), str(seq_len)]
            figures[producer].append(one_run(argv))
            shutil.rmtree(out, ignore_errors=True)
    return [PathFigures(fmt, producer, runs, *(statistics.median(run[i] for run in values) for i in range(3)))
            for producer, values in figures.items()]


def kernel_rates(repeat: int = 5) -> list[KernelFigures]:
    """The FP8 cast, the NVFP4 block quantizer and a plain copy over one seeded 4096 x 4096 bf16 weight (32 MB,
    beyond the caches), at 1 and 2 threads."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from trtllm_kit.llmapi.awq_entries import awq_quantize
    from trtllm_kit.llmapi.quant_format import quantize_weight, weight_scale
    from trtllm_kit.quant.nvfp4 import global_scale, nvfp4_quantize_rows

    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn((4096, 4096), generator=generator) * 0.02).to(torch.bfloat16)
    nbytes = weight.numel() * weight.element_size()
    amax = float(weight.abs().max())
    figures = []
    for threads in (1, 2):
        pool = ThreadPoolExecutor(threads)
        target = torch.empty_like(weight)
        kernels = {
            "copy": partial(target.copy_, weight),
            "fp8-cast": partial(quantize_weight, weight, weight_scale(amax), pool, threads),
            "nvfp4-block": partial(nvfp4_quantize_rows, weight, global_scale(amax), pool, threads),
        }
        if threads == 1:
            kernels["awq-pack"] = partial(awq_quantize, weight)
        for kernel, run in kernels.items():
            torch.set_num_threads(threads if kernel == "copy" else 1)  # the quantizers' threads are the pool's
            run()  # untimed warm-up
            best = float("inf")
            for _ in range(repeat):
                started = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - started)
            figures.append(KernelFigures(kernel, threads, nbytes / best / 1e9 / threads))
        pool.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--formats", default="fp8,nvfp4")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calib-samples", type=int, default=4)
    parser.add_argument("--calib-seq-len", type=int, default=64)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="quant-vs-modelopt-"))
    model = synthetic_model(workdir, args.preset)
    paths = [f for fmt in args.formats.split(",") for f in compare(model, workdir, fmt, args.runs,
                                                                   args.calib_samples, args.calib_seq_len)]
    kernels = kernel_rates()
    if args.json:
        print(json.dumps({"paths": [asdict(f) for f in paths], "kernels": [asdict(k) for k in kernels]}, indent=2))
        return
    for fmt in args.formats.split(","):
        kit, ref = (next(f for f in paths if f.format == fmt and f.producer == p) for p in ("kit", "modelopt"))
        print(f"{fmt}: kit {kit.seconds:.1f} s, {kit.peak_anon_gb:.2f} GB anon / {kit.peak_rss_gb:.2f} GB RSS; "
              f"modelopt {ref.seconds:.1f} s, {ref.peak_anon_gb:.2f} GB anon / {ref.peak_rss_gb:.2f} GB RSS; wall "
              f"{kit.seconds / ref.seconds:.2f}x, anon memory {kit.peak_anon_gb / ref.peak_anon_gb:.2f}x "
              f"(medians of {kit.runs})")
    for k in kernels:
        print(f"kernel {k.kernel} at {k.threads} thread(s): {k.gb_per_s_per_core:.2f} GB/s per core")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
