"""A build's precision: the checkpoint dtype and the ``QuantAlgo`` names of its weights/activations and of its KV
cache, and the element types and byte sizes they imply."""

from __future__ import annotations

from dataclasses import dataclass

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
ELEMENT_TYPES = {"FP8": "fp8", "INT8": "int8", "W8A16": "int8", "W8A8": "int8"}  # QuantAlgo (family) → element


def _algo_family(quant_algo: str | None) -> str:
    """``W8A8`` for every SmoothQuant flavour (``W8A8_SQ_*``), else the algorithm's own name ("" for none)."""
    return "W8A8" if (quant_algo or "").startswith("W8A8_SQ") else quant_algo or ""


@dataclass(frozen=True)
class Precision:
    """Checkpoint dtype and the ``QuantAlgo`` names of weights/activations and of the KV cache."""

    dtype: str
    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type: ``int8``, ``fp8`` or the dtype."""
        return ELEMENT_TYPES.get(self.kv_cache_quant_algo or "", self.dtype)

    @property
    def weight_dtype(self) -> str:
        """The linear weights' element type: ``int8`` (W8A16, SmoothQuant), ``fp8`` or the dtype."""
        return ELEMENT_TYPES.get(_algo_family(self.quant_algo), self.dtype)

    @property
    def activation_dtype(self) -> str:
        """The element type the GEMMs read activations in: ``int8`` (SmoothQuant), ``fp8`` or the dtype."""
        family = _algo_family(self.quant_algo)
        return ELEMENT_TYPES[family] if family in ("W8A8", "FP8") else self.dtype

    @property
    def kv_bytes(self) -> int:
        """Bytes per KV element (``b_kv``)."""
        return 1 if self.kv_cache_quant_algo else ITEMSIZE[self.dtype]
