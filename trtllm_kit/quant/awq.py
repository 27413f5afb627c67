"""INT4 AWQ (W4A16, groups of 128 or 64 input features, ``--awq-group-size``): the activation-aware scale search
and the int4 weight math, in the order and precision of ModelOpt's ``awq_lite`` and its export, so the searched
scales and the packed bytes are the same.

The search, per linear, over the calibration windows (each window one step, as ModelOpt's steps are its forward
passes):

* ``weight_profile``: each weight element divided by the largest magnitude of its group, averaged over the
  output rows (computed in the weight's dtype, kept in float32);
* ``activation_profile``: the mean magnitude of each input channel over a step's tokens, averaged over the steps;
* for each ``alpha`` of ``ALPHAS`` (0, 0.1, ..., 1 as float32), ``s = x^alpha / w^(1-alpha)`` clamped to
  [1e-4, 1e4] and divided by ``sqrt(max(s) · min(s))``; the loss is the mean squared difference between the
  linear's output and its output with inputs ``x / s`` and weights ``fake_int4(W · s)``, summed over the steps;
* the scale of the alpha with the least loss (the first on a tie) is the linear's ``best_scale``.

The steps' losses are summed in step order for each alpha, as ModelOpt sums them; the kit keeps a few steps'
inputs and outputs and makes each alpha's quantized weight (``fake_int4.py``) once for all of them and runs them
through one GEMM, where ModelOpt makes it again and runs one GEMM at every step.

The export divides each input channel of the weight by ``1 / best_scale`` (``pre_quant_scale`` is that
``1 / best_scale`` in the weight dtype) and quantizes groups with ``weight_scale = amax / 7`` (float32,
``[out, in/group]``): the codes are ``round(W / weight_scale)`` clamped to [-8, 7], packed two output rows per byte
(row ``2r`` in the low nibble of byte row ``r``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from trtllm_kit.layout import AWQ_GROUP_SIZE
from trtllm_kit.quant.blocks import default_workers, torch_threads
from trtllm_kit.quant.calib_size import AWQ_PENDING_BYTES
from trtllm_kit.quant.fake_int4 import INT4_MAX, INT4_MIN, FakeInt4, group_amax

ALPHAS = tuple(float(a) for a in torch.arange(0, 1.1, 0.1))  # float32 values, as ModelOpt's search grid
SCALE_RANGE = (1e-4, 1e4)


def weight_profile(weight: torch.Tensor, group_size: int = AWQ_GROUP_SIZE) -> torch.Tensor:
    """Per input channel: the mean over rows of ``|W| / amax(group)`` (float32 ``[in]``).

    Arguments:
        weight: ``[out, in]`` in the compute dtype, ``in`` a multiple of ``group_size``; group_size: input features
        per group.
    """
    magnitude = weight.reshape(-1, group_size).abs()
    amax = magnitude.amax(dim=1, keepdim=True)
    return magnitude.div_(amax + torch.finfo(weight.dtype).tiny).reshape(weight.shape).mean(0).to(torch.float32)


def activation_profile(x: torch.Tensor) -> torch.Tensor:
    """The mean magnitude of each input channel over one step's tokens, float32 ``[in]``.

    Arguments:
        x: the linear's input ``[..., in]``.
    """
    return x.abs().reshape(-1, x.shape[-1]).mean(0).to(torch.float32)


def smoothing_scale(x_profile: torch.Tensor, w_profile: torch.Tensor, alpha: float) -> torch.Tensor:
    """The per-input-channel scale for one ``alpha`` (float32 ``[in]``), normalised to a geometric mean of 1
    between its extremes.

    Arguments:
        x_profile: ``activation_profile`` averaged over steps; w_profile: ``weight_profile``; alpha: in [0, 1].
    """
    scale = x_profile.pow(alpha) / (w_profile.pow(1 - alpha) + torch.finfo(torch.float32).tiny)
    scale = scale.clamp(*SCALE_RANGE)
    return scale / (scale.max() * scale.min()).sqrt()


@dataclass
class ScaleSearch:
    """One linear's AWQ search: the activation profile over the first pass, the losses over the second.

    Arguments:
        weight: the linear's ``[out, in]`` weight in the compute dtype; bias: its bias or None; group_size: input
        features per group.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    group_size: int = AWQ_GROUP_SIZE
    x_sum: torch.Tensor | None = None
    num_steps: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    pending_bytes: int = 0
    w_profile: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.w_profile = weight_profile(self.weight, self.group_size)
        self.losses = [torch.zeros((), dtype=torch.float32) for _ in ALPHAS]

    def observe(self, x: torch.Tensor) -> None:
        """First pass: add one step's activation profile.

        Arguments:
            x: the linear's input for one step.
        """
        profile = activation_profile(x)
        self.x_sum = profile if self.x_sum is None else self.x_sum + profile
        self.num_steps += 1

    @property
    def x_profile(self) -> torch.Tensor:
        assert self.x_sum is not None, "observe() runs over every step before the search"
        return self.x_sum / self.num_steps

    def search(self, x: torch.Tensor, output: torch.Tensor) -> None:
        """Second pass: one step's input and output, whose loss for every alpha is added in step order once
        ``AWQ_PENDING_BYTES`` of steps wait (each alpha's quantized weight is then made once for all of them).

        Arguments:
            x: the linear's input for the step; output: the linear's unquantized output for it.
        """
        self.pending.append((x, output))
        self.pending_bytes += x.numel() * x.element_size() + output.numel() * output.element_size()
        if self.pending_bytes >= AWQ_PENDING_BYTES:
            self.flush()

    def flush(self) -> None:
        """Add the waiting steps' losses, step by step for each alpha (the sums are those of one step at a time).

        The steps' inputs go through one GEMM per alpha (an output row does not depend on the other rows) and
        each step's loss is the mean over its own rows. The fake quantization runs on threads of its own with
        one intra-op thread each (many small ops, each of which would otherwise wait at a barrier for the
        slowest core); the GEMM and the means run on the process's threads, as ModelOpt's do (a mean's rounding
        depends on how many threads share it)."""
        if not self.pending:
            return
        x_profile = self.x_profile
        inputs = torch.cat([x.reshape(-1, x.shape[-1]) for x, _ in self.pending])
        outputs = torch.cat([output.reshape(-1, output.shape[-1]) for _, output in self.pending])
        sizes = [output.numel() for _, output in self.pending]
        self.pending, self.pending_bytes = [], 0
        scaled_inputs = torch.empty_like(inputs)
        errors = torch.empty(outputs.shape, dtype=torch.float32, device=outputs.device)
        workers = default_workers()
        with ThreadPoolExecutor(workers, thread_name_prefix="awq-search") as pool:
            fake_quantize = FakeInt4(self.weight, pool, workers, self.group_size)
            for number, alpha in enumerate(ALPHAS):
                scale = smoothing_scale(x_profile, self.w_profile, alpha)
                with torch_threads(1):
                    quantized = fake_quantize(scale)
                    torch.mul(inputs, (1 / scale).to(self.weight.dtype), out=scaled_inputs)
                out = F.linear(scaled_inputs, quantized, self.bias)
                errors.copy_(out.sub_(outputs)).pow_(2)
                for error in errors.view(-1).split(sizes):
                    self.losses[number] += error.mean()

    def best_scale(self) -> torch.Tensor:
        """The scale of the alpha with the least summed loss (float32 ``[in]``)."""
        self.flush()
        losses = [float(loss) for loss in self.losses]
        best = losses.index(min(losses))
        return smoothing_scale(self.x_profile, self.w_profile, ALPHAS[best])


def smoothed_weight(weight: torch.Tensor, pre_quant_scale: torch.Tensor) -> torch.Tensor:
    """The weight with the inverse of ``pre_quant_scale`` folded into its input channels, in its dtype:
    ``W · (1 / pre_quant_scale)`` in float32, rounded once.

    Arguments:
        weight: ``[out, in]``; pre_quant_scale: float32 ``[in]`` (``1 / best_scale``).
    """
    return (weight * (1.0 / pre_quant_scale)[None, :]).to(weight.dtype)


def group_scales(weight: torch.Tensor, group_size: int = AWQ_GROUP_SIZE) -> torch.Tensor:
    """``weight_scale``: each group's amax in the weight's dtype, divided by 7 in float32 (an all-zero group: 1).

    Arguments:
        weight: ``[out, in]``, ``in`` a multiple of ``group_size``, contiguous; group_size: input features per group.
    """
    amax = group_amax(weight.reshape(-1, group_size)).float().reshape(weight.shape[0], -1)
    return amax.masked_fill_(amax == 0, INT4_MAX).div_(INT4_MAX)


def int4_pack(weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The packed int4 codes ``[out/2, in]`` uint8: ``round(W / weight_scale)`` in [-8, 7], row ``2r`` in the low
    nibble and row ``2r+1`` in the high nibble of byte row ``r``.

    Arguments:
        weight: ``[out, in]`` (``out`` even); scales: ``group_scales(weight, group_size)`` (``[out, in/group]``: the
        group size is ``in`` over its columns).
    """
    rows, cols = weight.shape
    quotients = weight.reshape(rows, scales.shape[1], -1) / scales[..., None]  # float32, as W / weight_scale
    codes = quotients.round_().clamp_(INT4_MIN, INT4_MAX).to(torch.int8).view(torch.uint8)
    pairs = codes.reshape(rows // 2, 2, cols)
    return pairs[:, 1].bitwise_left_shift(4).bitwise_or_(pairs[:, 0].bitwise_and(0x0F))


def int4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """The signed codes ``[out, in]`` (int8) of ``int4_pack``'s bytes.

    Arguments:
        packed: ``[out/2, in]`` uint8.
    """
    low = (packed & 0x0F).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    codes = torch.stack([low, high], dim=1).reshape(-1, packed.shape[1])
    return torch.where(codes > 7, codes - 16, codes)


def int4_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weight a packed int4 tensor stands for: ``code · weight_scale``, the group size being the
    checkpoint's (``in`` over the scales' columns).

    Arguments:
        packed: ``[out/2, in]`` uint8; scales: ``[out, in/group]`` float32.
    """
    codes = int4_unpack(packed).float()
    if codes.shape[1] % scales.shape[1]:
        raise ValueError(f"INT4 weight scales {tuple(scales.shape)} do not divide a weight of {codes.shape[1]} "
                         "input features into whole groups")
    return codes * scales.float().repeat_interleave(codes.shape[1] // scales.shape[1], dim=1)
