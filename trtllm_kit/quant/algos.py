"""Quantization choices: the user's flags, the TensorRT-LLM ``QuantAlgo`` names they map to, and the one table of
valid ``quant_algo`` × ``kv_cache_quant_algo`` combinations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.enums import CalibDtype, KVCache, Quant
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import AWQ_GROUP_SIZE, AWQ_GROUP_SIZES
from trtllm_kit.models.hf_config import HFConfig

QUANT_CHOICES = Quant.values()
KV_CACHE_CHOICES = KVCache.values()
KV_ALGOS = {"auto": None, "int8": "INT8", "fp8": "FP8"}
SQ_ALGOS = {  # (per_channel, per_token) → the plugin algorithm
    (False, False): "W8A8_SQ_PER_TENSOR_PLUGIN",
    (True, False): "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN",
    (False, True): "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN",
    (True, True): "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
}

# --quant → the --kv-cache values it combines with. Combinations that QuantMode accepts but whose runtime
# support upstream is unverified (W8A16 or SmoothQuant with an FP8 cache, FP8 with an INT8 cache) are refused.
VALID_COMBINATIONS: dict[str, tuple[str, ...]] = {
    "none": ("auto", "int8", "fp8"),
    "int8-wo": ("auto", "int8"),
    "int8-sq": ("auto", "int8"),
    "fp8": ("auto", "fp8"),
    "nvfp4": ("auto", "fp8"),
    "int4-awq": ("auto", "int8", "fp8"),
}
NVFP4_MIN_SM = (10, 0)  # FP4 tensor cores: Blackwell
# --quant values some targets do not export: the targets that do, and why elsewhere they are refused
TARGETS_OF = {"nvfp4": ("llmapi",), "int4-awq": ("llmapi", "engine")}
REFUSED_TARGET = {
    "nvfp4": "--quant nvfp4 is exported for --target llmapi only (ModelOpt's unified format, which TensorRT-LLM's "
             "PyTorch backend serves on Blackwell GPUs, compute capability >= 10.0); build with --target llmapi "
             "or choose --quant fp8 for the {target} target.",
    "int4-awq": "--quant int4-awq is exported for --target llmapi and --target engine (TensorRT-LLM's W4A16 AWQ "
                "kernels run on GPUs), not for the {target} target; build with one of those targets, or choose "
                "--quant int8-wo for the {target} target.",
}
DEFAULT_CALIB_SEED = 1234
DEFAULT_SMOOTHQUANT_ALPHA = 0.5


def check_combination(quant: str, kv_cache: str) -> None:
    """Refuse an unknown choice or a combination outside ``VALID_COMBINATIONS``, naming the valid ones.

    Arguments:
        quant: a ``QUANT_CHOICES`` value; kv_cache: a ``KV_CACHE_CHOICES`` value.
    """
    if quant not in QUANT_CHOICES:
        raise KitUsageError(f"--quant {quant!r} is not one of {', '.join(QUANT_CHOICES)}.")
    if kv_cache not in KV_CACHE_CHOICES:
        raise KitUsageError(f"--kv-cache {kv_cache!r} is not one of {', '.join(KV_CACHE_CHOICES)}.")
    valid = VALID_COMBINATIONS[quant]
    if kv_cache not in valid:
        others = [q for q, kvs in VALID_COMBINATIONS.items() if kv_cache in kvs]
        raise KitUsageError(f"--quant {quant} cannot be combined with --kv-cache {kv_cache}; with --quant {quant} "
                            f"use --kv-cache {_either(valid)}, or use --kv-cache {kv_cache} with --quant "
                            f"{_either(others)}.")


def _either(choices: tuple[str, ...] | list[str]) -> str:
    return " or ".join(choices) if len(choices) < 3 else f"{', '.join(choices[:-1])} or {choices[-1]}"


@dataclass(frozen=True)
class QuantConfig:
    """What to quantize and how to calibrate: validated on construction."""

    quant: str = Quant.NONE.value
    kv_cache: str = KVCache.AUTO.value
    smoothquant_alpha: float = DEFAULT_SMOOTHQUANT_ALPHA
    per_channel: bool = False
    per_token: bool = False
    calib_data: Path | None = None
    calib_samples: int | None = None  # None: sized by the device (quant/calib_size.py)
    calib_seq_len: int | None = None
    calib_seed: int = DEFAULT_CALIB_SEED
    calib_dtype: str = CalibDtype.BFLOAT16.value
    awq_group_size: int = AWQ_GROUP_SIZE

    def __post_init__(self) -> None:
        check_combination(self.quant, self.kv_cache)
        alpha = self.smoothquant_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0.0 <= alpha <= 1.0:
            raise KitUsageError(f"--smoothquant-alpha must be a number in [0, 1], got {alpha!r}.")
        if (self.per_channel or self.per_token) and self.quant != "int8-sq":
            raise KitUsageError(f"--per-channel and --per-token apply to --quant int8-sq only, not --quant "
                                f"{self.quant}.")
        for name in ("calib_samples", "calib_seq_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise KitUsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}.")
        if self.awq_group_size not in AWQ_GROUP_SIZES or isinstance(self.awq_group_size, bool):
            raise KitUsageError(f"--awq-group-size must be one of {_either([str(g) for g in AWQ_GROUP_SIZES])} (the "
                                f"group sizes TensorRT-LLM's W4A16 AWQ takes), got {self.awq_group_size!r}.")
        if self.awq_group_size != AWQ_GROUP_SIZE and self.quant != "int4-awq":
            raise KitUsageError(f"--awq-group-size applies to --quant int4-awq only, not --quant {self.quant}; "
                                "leave it at its default.")
        if isinstance(self.calib_seed, bool) or not isinstance(self.calib_seed, int):
            raise KitUsageError(f"--calib-seed must be an integer, got {self.calib_seed!r}.")
        object.__setattr__(self, "calib_dtype", str(CalibDtype.parse("--calib-dtype", self.calib_dtype)))
        if self.calib_data is not None:
            object.__setattr__(self, "calib_data", Path(self.calib_data))

    @property
    def quant_algo(self) -> str | None:
        """The ``QuantAlgo`` member name of the weights/activations, or None."""
        if self.quant == "int8-wo":
            return "W8A16"
        if self.quant == "int8-sq":
            return SQ_ALGOS[(self.per_channel, self.per_token)]
        return {"fp8": "FP8", "nvfp4": "NVFP4", "int4-awq": "W4A16_AWQ"}.get(self.quant)

    @property
    def kv_cache_quant_algo(self) -> str | None:
        return KV_ALGOS[self.kv_cache]

    @property
    def is_quantized(self) -> bool:
        return self.quant_algo is not None or self.kv_cache_quant_algo is not None

    @property
    def needs_calibration(self) -> bool:
        """Every algorithm except W8A16 needs activation ranges (NVFP4 for its global input and weight scales,
        INT4 AWQ for its scale search), and so does any KV-cache quantization."""
        return self.quant in ("int8-sq", "fp8", "nvfp4", "int4-awq") or self.kv_cache_quant_algo is not None

    @property
    def searches_awq(self) -> bool:
        """Whether calibration searches INT4 AWQ scales (``quant/awq.py``)."""
        return self.quant == "int4-awq"

    def quantization_block(self) -> dict[str, Any]:
        """The ``quantization`` object of the checkpoint ``config.json`` (portable keys only,
        docs/trtllm-checkpoint.md §2.3)."""
        return {"quant_algo": self.quant_algo, "kv_cache_quant_algo": self.kv_cache_quant_algo,
                "group_size": self.awq_group_size, "has_zero_point": False, "pre_quant_scale": self.searches_awq,
                "exclude_modules": ["lm_head"] if self.quant in ("fp8", "int4-awq") else None}

    def calibration_params(self) -> dict[str, Any]:
        """What decides the calibration statistics (for the manifest and the stats' sidecar)."""
        return {"calib_data": str(self.calib_data) if self.calib_data else "builtin:corpus",
                "calib_samples": self.calib_samples, "calib_seq_len": self.calib_seq_len,
                "calib_seed": self.calib_seed, "calib_dtype": self.calib_dtype,
                **({"awq_group_size": self.awq_group_size} if self.searches_awq else {})}


def check_target(config: QuantConfig, target: str) -> None:
    """Refuse a ``--quant`` that only another target exports, in one sentence.

    Arguments:
        config: the quantization; target: the build's target name.
    """
    if config.quant in TARGETS_OF and target not in TARGETS_OF[config.quant]:
        raise KitUsageError(REFUSED_TARGET[config.quant].format(target=target))


def check_groups(config: QuantConfig, hidden_size: int, attention_width: int, intermediate_size: int,
                 tp_size: int) -> None:
    """Refuse INT4 AWQ when a quantized linear's input features on one rank are not whole groups of
    ``--awq-group-size``, in one sentence naming a group size that fits where one does (before calibration,
    instead of a reshape error after it).

    Arguments:
        config: the quantization; hidden_size, attention_width (heads x head size), intermediate_size: the model's
        widths; tp_size: tensor-parallel size (the attention output and the MLP's down projection are split by it).
    """
    if config.quant != "int4-awq":
        return
    widths = {"hidden size (q/k/v, gate/up inputs)": hidden_size,
              "attention output per rank (o_proj input)": attention_width // tp_size,
              "intermediate size per rank (down_proj input)": intermediate_size // tp_size}
    group = config.awq_group_size
    for what, width in widths.items():
        if width % group:
            fits = [g for g in AWQ_GROUP_SIZES if not any(w % g for w in widths.values())]
            instead = (f"build with --awq-group-size {fits[0]}" if fits else
                       "use --quant fp8 or int8-wo for this model (or another --tp)")
            raise KitUsageError(f"--quant int4-awq quantizes groups of {group} input features, but the model's "
                                f"{what} is {width}, not a multiple of {group}; {instead}.")


def check_model(config: QuantConfig, hf: HFConfig, tp_size: int) -> None:
    """Refuse a quantization the model cannot take at this layout.

    Arguments:
        config: the quantization; hf: the model's config; tp_size: tensor-parallel size.
    """
    check_groups(config, hf.hidden_size, hf.num_attention_heads * hf.head_dim, hf.intermediate_size, tp_size)
    num_kv_heads = hf.num_key_value_heads
    if config.quant == "int8-sq" and num_kv_heads < tp_size:
        raise KitUsageError(f"--quant int8-sq needs at least as many KV heads as --tp (the SmoothQuant plugin path "
                            f"cannot duplicate KV heads), but the model has {num_kv_heads} KV head(s) and tp is "
                            f"{tp_size}; use --tp {num_kv_heads} or less, or --quant int8-wo or fp8.")
