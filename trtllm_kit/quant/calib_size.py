"""How much text calibration runs over when the user does not say: sized by the device that runs it.

On a GPU the default is upstream's (``docs/trtllm-checkpoint.md`` §6: 512 samples × 512 tokens, as TensorRT-LLM's
and ModelOpt's quantization scripts have it). On a CPU that is 262,144 tokens through a forward pass:
``benchmarks/calibration.py`` measured about ``CPU_SECONDS_PER_TOKEN_7B`` per token for a 7B-class model in float32
on the 2-core reference machine (extrapolated from one- and four-layer models of Llama-2-7B's shape: t(L) = a + b·L at
L = 32), i.e. about 84 hours; the CPU default keeps it to about 20 minutes (and a built-in model's to seconds,
where the GPU default took 3-12 minutes). ``--calib-samples`` / ``--calib-seq-len`` given explicitly always win,
on either device. ``calibration_memory`` is the peak a layer-streamed calibration holds (``layer_stream.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from trtllm_kit.quant.algos import QuantConfig

if TYPE_CHECKING:
    from trtllm_kit.models.hf_config import HFConfig

GPU_SAMPLES, GPU_SEQ_LEN = 512, 512  # upstream's calib_size × calib_max_seq_length
CPU_SAMPLES, CPU_SEQ_LEN = 16, 64  # 1,024 tokens: about 20 min for a 7B model, 1-3 s for the built-in models
CPU_SECONDS_PER_TOKEN_7B = 1.16  # benchmarks/calibration.py on the shared 2-core reference machine (extrapolated)
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}

BATCH_SIZE = 8  # windows per forward pass (a CPU's batch gives each window's rows bitwise as one window alone)
AWQ_PENDING_BYTES = 64 << 20  # inputs and outputs one linear's AWQ search keeps before it adds their losses

@dataclass(frozen=True)
class CalibSize:
    """The calibration size a build uses and why."""

    samples: int
    seq_len: int
    device: str
    reason: str

    @property
    def tokens(self) -> int:
        return self.samples * self.seq_len


def calibration_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu`` (the device ``calibrate`` runs on by default)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def choose_size(config: QuantConfig, device: str) -> CalibSize:
    """The windows and tokens per window for ``device``; values the user gave are kept.

    Arguments:
        config: the quantization (``calib_samples`` / ``calib_seq_len`` None when not given);
        device: ``cpu`` or a CUDA device name.
    """
    on_gpu = device != "cpu"
    default_samples, default_seq_len = (GPU_SAMPLES, GPU_SEQ_LEN) if on_gpu else (CPU_SAMPLES, CPU_SEQ_LEN)
    samples = config.calib_samples if config.calib_samples is not None else default_samples
    seq_len = config.calib_seq_len if config.calib_seq_len is not None else default_seq_len
    defaulted = [f"--calib-{n} {v}" for n, v, mine in (("samples", samples, config.calib_samples),
                                                        ("seq-len", seq_len, config.calib_seq_len)) if mine is None]
    where = "GPU" if on_gpu else "CPU"
    if not defaulted:
        reason = "as given"
    elif len(defaulted) == 2:
        reason = f"the {where} default"
    else:
        reason = f"{defaulted[0]} is the {where} default"
    if on_gpu:
        reason += " (upstream's calibration size)" if len(defaulted) == 2 else ""
    elif defaulted:
        reason += (f"; about {estimate_minutes(samples * seq_len):.0f} min for a 7B model on a 2-core CPU, where "
                   f"the GPU default {GPU_SAMPLES} x {GPU_SEQ_LEN} would take "
                   f"{estimate_minutes(GPU_SAMPLES * GPU_SEQ_LEN) / 60:.0f} h")
        reason += "; --calib-samples/--calib-seq-len set it"
    return CalibSize(samples, seq_len, device, reason)


def estimate_minutes(tokens: int) -> float:
    """Minutes a 7B-class model takes to calibrate ``tokens`` on the 2-core reference CPU (an extrapolation).

    Arguments:
        tokens: windows x tokens per window.
    """
    return tokens * CPU_SECONDS_PER_TOKEN_7B / 60


def sized(config: QuantConfig, size: CalibSize) -> QuantConfig:
    """``config`` with the chosen calibration size filled in.

    Arguments:
        config: the quantization; size: from ``choose_size``.
    """
    return replace(config, calib_samples=size.samples, calib_seq_len=size.seq_len)


@dataclass(frozen=True)
class CalibMemory:
    """The peak memory of a layer-streamed calibration (``layer_stream.py``), by part, in bytes."""

    layer_bytes: int       # one decoder layer's weights in the compute dtype
    activation_bytes: int  # every window's hidden state: samples x seq_len x hidden x dtype
    kv_bytes: int          # one layer's keys and values over one batch of windows
    search_bytes: int = 0  # INT4 AWQ: the scale search's work on the largest linear (quant/awq.py)

    @property
    def total_bytes(self) -> int:
        return self.layer_bytes + self.activation_bytes + self.kv_bytes + self.search_bytes


def calibration_memory(hf: HFConfig, size: CalibSize, dtype: str, search_awq: bool = False) -> CalibMemory:
    """What a layer-streamed calibration of ``hf`` holds at its peak. The AWQ search keeps each linear's windows,
    at most ``AWQ_PENDING_BYTES`` of them, and works on one linear at a time: its fake-quantized weight in the
    compute dtype (the blocks it is made in are small), and for the kept windows one copy of their inputs and
    outputs, the scaled inputs, the quantized output and the float32 difference.

    Arguments:
        hf: the model's config; size: the calibration size (its device decides the batch); dtype: the compute
        dtype (``bfloat16`` or ``float32``); search_awq: whether the INT4 AWQ scale search runs.
    """
    per = DTYPE_BYTES[dtype]
    h, d = hf.hidden_size, hf.head_dim
    layer = h * d * (2 * hf.num_attention_heads + 2 * hf.num_key_value_heads) + 3 * h * hf.intermediate_size + 2 * h
    batch = min(size.samples, BATCH_SIZE)
    kv = 2 * batch * size.seq_len * hf.num_key_value_heads * d
    search = 0
    if search_awq:
        q, k, inter = hf.num_attention_heads * d, hf.num_key_value_heads * d, hf.intermediate_size
        features = [h + q, h + k, h + k, q + h, h + inter, h + inter, inter + h]  # in + out of each linear
        kept = [min(AWQ_PENDING_BYTES, size.samples * size.seq_len * f * per) for f in features]
        flush = max(kept) * (2 + 4 // per)  # copies + scaled inputs and output + float32 difference, at most
        search = h * inter * per + sum(kept) + flush
    return CalibMemory(layer * per, size.samples * size.seq_len * h * per, kv * per, search)
