"""Where the searched AWQ scales go at export, as ModelOpt's exports put them.

* Unified HF format (``UNIFIED``): linears that read one input (q/k/v, gate/up) share the mean of their
  ``pre_quant_scale``; each weight is divided by its own and multiplied back to the shared one; the shared scale is
  folded into the norm before them, and every other linear keeps its ``pre_quant_scale`` tensor (o_proj,
  down_proj, and Phi-3's fused qkv_proj and gate_up_proj, which share with nothing).
* TensorRT-LLM checkpoint (``TRTLLM``): only q/k/v, fused into one ``qkv`` linear, share the mean; every linear
  keeps a ``prequant_scaling_factor`` and the norms stay as they are.

Per linear with searched scale ``b`` (float32, ``quant/awq.py``), in the checkpoint dtype ``D``:

* ``own = (1 / b).to(D)``; ``W1 = (W · (1 / (1 / b))).to(D)`` (the reciprocal of the float32 ``1 / b``);
* ``shared = mean(own over the group)`` in ``D``; where ``own != shared``,
  ``W2 = (W1 · own / shared).to(D)`` in float32;
* the norm before the group: ``norm · shared`` in ``D``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_kit.quant.calibrate import CalibrationStats

SHARED_INPUT_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
NORM_BEFORE = {"input_layernorm": "self_attn", "post_attention_layernorm": "mlp"}  # norm → the block it feeds


@dataclass(frozen=True)
class FoldPolicy:
    """Which linears share one scale, and whether a shared scale goes into the norm before them."""

    groups: tuple[tuple[str, ...], ...]
    into_norms: bool


UNIFIED = FoldPolicy(SHARED_INPUT_GROUPS, into_norms=True)
TRTLLM = FoldPolicy(SHARED_INPUT_GROUPS[:1], into_norms=False)


def shares_input(module: str) -> bool:
    """Whether the linear reads its input with others (then its scale is in the norm before them, not a tensor).

    Arguments:
        module: an HF linear name.
    """
    leaf = module.rpartition(".")[2]
    return any(leaf in group for group in SHARED_INPUT_GROUPS)


class AwqFold:
    """The export-time placement of one model's AWQ scales.

    Arguments:
        stats: calibration statistics holding ``awq`` scales per HF linear; dtype: the checkpoint dtype;
        policy: ``UNIFIED`` or ``TRTLLM``.
    """

    def __init__(self, stats: CalibrationStats, dtype: torch.dtype, policy: FoldPolicy = UNIFIED) -> None:
        self.stats = stats
        self.dtype = dtype
        self.policy = policy

    def group(self, module: str) -> list[str]:
        """The linears that read ``module``'s input, itself included (``model.layers.0.self_attn.k_proj`` → its
        q/k/v).

        Arguments:
            module: an HF linear name.
        """
        parent, _, leaf = module.rpartition(".")
        return [f"{parent}.{name}" for name in next((g for g in self.policy.groups if leaf in g), (leaf,))]

    def own_scale(self, module: str) -> torch.Tensor:
        """``1 / best_scale`` in float32.

        Arguments:
            module: an HF linear name.
        """
        return 1.0 / self.stats.get("awq", module)

    def shared_scale(self, module: str) -> torch.Tensor:
        """The ``pre_quant_scale`` the linear's input is multiplied by, in the checkpoint dtype.

        Arguments:
            module: an HF linear name.
        """
        own = [self.own_scale(m).to(self.dtype) for m in self.group(module)]
        return own[0] if len(own) == 1 else torch.stack(own).mean(0)

    def weight(self, module: str, weight: torch.Tensor, columns: slice = slice(None)) -> torch.Tensor:
        """The linear's weight with its scale folded in, ready for ``group_scales`` / ``int4_pack``.

        Arguments:
            module: an HF linear name; weight: ``[out, in]`` in the checkpoint dtype, or the input features
            ``columns`` of it (a row-parallel rank's part).
        """
        own = self.own_scale(module)[columns]
        smoothed = (weight * (1.0 / own)[None, :]).to(self.dtype)
        own_d, shared = own.to(self.dtype), self.shared_scale(module)[columns]
        if torch.equal(own_d, shared):
            return smoothed
        return (smoothed.float() * own_d.float() / shared.float()).to(self.dtype)

    def norm_scale(self, norm: str) -> torch.Tensor | None:
        """The shared scale folded into a norm's weight (``model.layers.0.input_layernorm``), or None.

        Arguments:
            norm: an HF module name.
        """
        parent, _, leaf = norm.rpartition(".")
        if leaf not in NORM_BEFORE or not self.policy.into_norms:
            return None
        block = f"{parent}.{NORM_BEFORE[leaf]}"
        first = next((f"{block}.{g[0]}" for g in self.policy.groups if f"{block}.{g[0]}" in self.stats.awq), None)
        return None if first is None else self.shared_scale(first)

    def norm(self, norm: str, weight: torch.Tensor) -> torch.Tensor:
        """The norm's weight times its folded scale (unchanged when it has none), in the checkpoint dtype.

        Arguments:
            norm: the HF module name; weight: its weight.
        """
        scale = self.norm_scale(norm)
        weight = weight.to(self.dtype)
        return weight if scale is None else weight * scale
