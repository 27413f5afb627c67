"""The product ``x @ W.T`` of a float32 linear, one function for every path of the runtime (``layers.linear``, the
fused gate/up, the decode fast paths ``single_decode.py`` and ``batch_decode.py``), so that they keep giving the
general step's values bit for bit.

From two rows up (a decode step of several sequences, a prompt) the product runs on oneDNN with the weight packed
once in its blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, the kernel torch's compiler uses for frozen
CPU linears): the products of a SmolLM2 step took 86.7 ms of CPU against MKL's 129.4 at 8 rows, and 267.5 against
348.6 at 64 (``python benchmarks/linear_layouts.py --rows 1,2,8,32,64``). One row (one sequence decoding alone)
stays with MKL's product, which is as fast there. oneDNN's product gives a row the same bits whatever the number of
rows beside it, where MKL's changes them between 3 and 8 rows; its results differ from MKL's in the last bits (about
2e-6 on SmolLM2's weights), as any two orders of summation do, within float32's own noise that verify's tolerance
allows for (``checkpoint/verify.FP32_REL_TOL``). The model packs its weights when it loads
(``CheckpointModel.pack_products``), which holds every float32 linear weight twice.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

PACKED = ".packed"  # beside ``{linear}.weight`` in a rank's prepared tensors: its packed copy, when made
PACKED_MIN_ROWS = 2  # one row (a lone decode step) multiplies faster with MKL's product
PACKED_FOR_ROWS = 8  # the row count oneDNN chooses the packed layout for


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``weight`` gets a packed copy: a float32 matrix, with oneDNN in this torch.

    Arguments:
        weight: a linear's weight [out, in].
    """
    return (weight.dtype == torch.float32 and weight.dim() == 2 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] in oneDNN's blocked layout, for ``product``.

    Arguments:
        weight: a float32 linear weight [out, in], in any layout.
    """
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACKED_FOR_ROWS)


def product(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T``: with the packed copy when ``x`` has at least ``PACKED_MIN_ROWS`` rows, else ``F.linear``.

    Arguments:
        x: activations [..., in]; weight: [out, in] (any layout); packed: ``pack(weight)``, or None.
    """
    rows = x.numel() // x.shape[-1]
    if packed is None or rows < PACKED_MIN_ROWS:
        return torch.nn.functional.linear(x, weight)
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]), packed, None, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


class LinearWeight(NamedTuple):
    """A linear's weight [out, in] (any layout) and its packed copy (None: not packed), multiplied by ``product``."""

    matrix: torch.Tensor
    packed: torch.Tensor | None

    def times(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ matrix.T`` through ``product``.

        Arguments:
            x: activations [..., in].
        """
        return product(x, self.matrix, self.packed)
