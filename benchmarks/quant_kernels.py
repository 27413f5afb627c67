"""The quantization kernels the conversion and the llmapi export run, timed alone over a preset's largest MLP weight:
GB/s of bf16 input, on one block thread and on the kit's default number (one intra-op thread each).

    python benchmarks/quant_kernels.py [--preset tinyllama-1.1b]

``benchmarks/convert.py`` prints the same lines after its quantized variants.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEAT = 5  # timed runs per kernel, after one untimed; the median is kept


def kernel_figures(preset: str, workers: int) -> dict[str, float]:
    """GB/s of bf16 input of each quantization kernel with ``workers`` block threads, one intra-op thread each
    (median of ``REPEAT``, after a warm-up)."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    from synthetic_checkpoint import PRESETS

    from trtllm_kit.llmapi.quant_format import quantize_weight
    from trtllm_kit.quant.blocks import BlockBuffer
    from trtllm_kit.quant.fp8 import fp8_quantize
    from trtllm_kit.quant.int8 import quantize_rows_int8, smoothed_row_amax, w8a16_quantize

    torch.set_num_threads(1)
    dims = PRESETS[preset]
    weight = (torch.randn(dims["intermediate_size"], dims["hidden_size"]) * 0.02).to(torch.bfloat16)
    smoother = torch.rand(dims["hidden_size"]) + 0.5
    row_scale = torch.full((weight.shape[0],), 127.0 / 0.1)
    buffer = BlockBuffer(workers=workers)
    buffer_pool = ThreadPoolExecutor(workers)  # the unified export's FP8 kernel takes a pool, as write_unified does
    kernels = {
        "fp8": lambda: fp8_quantize(weight, 1e-4, buffer),
        "sq-int8": lambda: quantize_rows_int8(weight, row_scale, smoother, buffer),
        "sq-amax": lambda: smoothed_row_amax(weight, smoother, buffer),
        "w8a16": lambda: w8a16_quantize(weight, buffer),
        "llmapi-fp8": lambda: quantize_weight(weight, torch.tensor(1e-4), buffer_pool, workers),
    }
    figures = {}
    for name, kernel in kernels.items():
        kernel()
        times = []
        for _ in range(REPEAT):
            start = time.perf_counter()
            kernel()
            times.append(time.perf_counter() - start)
        figures[name] = weight.numel() * 2 / sorted(times)[REPEAT // 2] / 1e9
    buffer_pool.shutdown()
    return figures


def print_kernel_figures(preset: str) -> None:
    """One line per thread count: each kernel's GB/s of bf16 input."""
    from trtllm_kit.quant.blocks import default_workers

    for workers in sorted({1, default_workers()}):
        kernels = kernel_figures(preset, workers)
        print(f"quantization kernels, {workers} thread(s), GB/s of bf16 input (target >= 1 on one): "
              + ", ".join(f"{name} {rate:.2f}" for name, rate in kernels.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tinyllama-1.1b")
    print_kernel_figures(parser.parse_args().preset)


if __name__ == "__main__":
    main()
