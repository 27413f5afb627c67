"""Where a decoder step on a GPU turns compute-bound: the knee of its roofline, in tokens per step.

A step over ``T`` tokens reads every weight once (``bytes_per_weight`` each) and does two FLOPs per weight and
token, so it is memory-bound while ``2 T / bytes_per_weight`` is below the GPU's FLOPs per byte of bandwidth:

    knee = peak FLOP/s / memory bandwidth (bytes/s) x bytes_per_weight / 2

The peak is the dense tensor-core figure of the dtype the GEMMs run in (``Precision.activation_dtype``): FP16/BF16
for a plain build and for weight-only quantization (W8A16, W4A16 AWQ: the weights are read small, the math is
FP16), FP8 for FP8, INT8 for SmoothQuant. NVFP4 (FP4 tensor cores) and float32 have no figure in the GPU table.
Attention (its KV reads) and how close kernels come to the peaks are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_kit.gpus import GPU, board_of
from trtllm_kit.layout import PACKED_ALGOS
from trtllm_kit.precision import ITEMSIZE, Precision

TENSOR_CORE_NAMES = {"float16": "FP16/BF16", "bfloat16": "FP16/BF16", "fp8": "FP8", "int8": "INT8",
                     "float32": "FP32", "fp4": "FP4"}


@dataclass(frozen=True)
class Roofline:
    """A build's figures on one GPU: the tensor cores its GEMMs run on, their peak, the bandwidth, the weight size.

    ``peak_flops`` or ``memory_bandwidth`` is None where the GPU table does not hold it; the knee is then unknown.
    """

    gpu: str
    tensor_cores: str  # a TENSOR_CORE_NAMES key: the dtype the GEMMs compute in
    peak_flops: float | None
    memory_bandwidth: float | None  # bytes/s
    bytes_per_weight: float

    @property
    def knee_tokens(self) -> float | None:
        """Tokens per step at which the step turns compute-bound; None when a figure is unknown."""
        if self.peak_flops is None or self.memory_bandwidth is None:
            return None
        return self.peak_flops / self.memory_bandwidth * self.bytes_per_weight / 2

    @property
    def unknown(self) -> str | None:
        """Why the knee is unknown (which figure the table lacks), or None when it is known."""
        missing = [what for what, value in ((f"{TENSOR_CORE_NAMES[self.tensor_cores]} tensor-core FLOP/s",
                                             self.peak_flops), ("memory bandwidth", self.memory_bandwidth))
                   if value is None]
        if not missing:
            return None
        return (f"the GPU table holds no {' or '.join(missing)} for {self.gpu}, so the plan does not know where a step "
                "turns compute-bound")


def roofline(gpu: GPU, precision: Precision) -> Roofline:
    """The roofline of a build of ``precision`` on ``gpu`` (its figures from the GPU table, when it came from it).

    Arguments:
        gpu: the GPU the plan is for; precision: the build's dtype and quantization.
    """
    board = board_of(gpu)
    tensor_cores = "fp4" if precision.quant_algo == "NVFP4" else precision.activation_dtype
    # 4-bit weights two to a byte; int8 and fp8 weights one byte; else the dtype's
    weight_bytes = 0.5 if precision.quant_algo in PACKED_ALGOS else float(ITEMSIZE.get(precision.weight_dtype, 1))
    peaks = {} if board is None else {"float16": board.fp16_flops, "bfloat16": board.fp16_flops,
                                      "fp8": board.fp8_flops, "int8": board.int8_ops}
    return Roofline(gpu.name, tensor_cores, peaks.get(tensor_cores),
                    None if board is None else board.memory_bandwidth, weight_bytes)
