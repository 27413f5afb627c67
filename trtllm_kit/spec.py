"""Build specifications: typed, validated, from ``trtllm-kit.toml`` and/or CLI flags (flags win)."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.quant.algos import QuantConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DTYPES = ("auto", "float16", "bfloat16", "float32")
STAGES = ("checkpoint", "engine", "repo")
TARGETS = ("auto", "cpu", "engine", "llmapi")
TABLES = ("build", "engine", "repo", "quant")
LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block")


@dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs to know; the manifest records it verbatim."""

    model: str
    out: Path
    tp: int = 1
    pp: int = 1
    dtype: str = "auto"
    until: str = STAGES[-1]
    target: str = "auto"
    verify: bool | None = None  # None: verify when the model is small enough
    allow_pickle: bool = False
    force: bool = False
    # quantization ([quant] table): algorithm, KV cache, SmoothQuant options and calibration
    quant: str = "none"
    kv_cache: str = "auto"
    smoothquant_alpha: float = 0.5
    per_channel: bool = False
    per_token: bool = False
    calib_data: str | None = None
    calib_samples: int = 512
    calib_seq_len: int = 512
    calib_seed: int = 1234
    # engine stage: the GPU to plan for (NVML when None), the KV-cache share and the engine limits (None: planned)
    gpu: str | None = None
    gpu_memory: float | None = None  # GiB
    kv_cache_fraction: float = 0.9
    max_batch_size: int | None = None
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    tokens_per_block: int = 32
    build_flags: dict[str, str] = field(default_factory=dict)  # trtllm-build overrides, NAME → VALUE
    archive: Path | None = None
    # repo stage ([repo] table): Triton model repository settings (None: derived from the engine and the plan)
    decoupled: bool = True
    max_tokens_in_paged_kv_cache: int | None = None
    enable_kv_cache_reuse: bool | None = None
    enable_chunked_context: bool | None = None
    batch_scheduler_policy: str = "guaranteed_no_evict"
    max_queue_size: int = 0
    max_queue_delay_microseconds: int = 0
    exclude_input_in_output: bool = True
    preprocessing_instances: int | None = None
    postprocessing_instances: int | None = None
    bls_instances: int | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise KitUsageError("no model given; pass a model directory, a cached repo id or builtin:tiny-llama.")
        for name in ("tp", "pp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KitUsageError(f"{name} must be a positive integer, got {value!r}.")
        _choice("dtype", self.dtype, DTYPES)
        _choice("until", self.until, STAGES)
        _choice("target", self.target, TARGETS)
        object.__setattr__(self, "out", Path(self.out))
        self.quant_config()  # validates the quantization fields
        _check_engine_fields(self)
        from trtllm_kit.model_repo.options import RepoOptions

        RepoOptions.from_values(asdict(self))  # validates the [repo] fields

    def quant_config(self) -> QuantConfig:
        """The quantization part of the spec (validated: refuses invalid combinations)."""
        return QuantConfig(quant=self.quant, kv_cache=self.kv_cache, smoothquant_alpha=self.smoothquant_alpha,
                           per_channel=self.per_channel, per_token=self.per_token,
                           calib_data=Path(self.calib_data) if self.calib_data else None,
                           calib_samples=self.calib_samples, calib_seq_len=self.calib_seq_len,
                           calib_seed=self.calib_seed)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["out"] = str(self.out)
        values["archive"] = str(self.archive) if self.archive else None
        return values


def _check_engine_fields(spec: BuildSpec) -> None:
    for name in LIMITS:
        value = getattr(spec, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise KitUsageError(f"{name} must be a positive integer, got {value!r}.")
    if spec.tokens_per_block & (spec.tokens_per_block - 1):
        raise KitUsageError(f"tokens_per_block must be a power of two (32 and 64 are common), got "
                            f"{spec.tokens_per_block}.")
    fraction = spec.kv_cache_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise KitUsageError(f"kv_cache_fraction must be a number in (0, 1], got {fraction!r}.")
    memory = spec.gpu_memory
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float) or memory <= 0):
        raise KitUsageError(f"gpu_memory must be a positive number of GiB, got {memory!r}.")
    if not isinstance(spec.build_flags, dict) or not all(isinstance(v, str | int) for v in spec.build_flags.values()):
        raise KitUsageError(f"build_flags must be a table of NAME = \"VALUE\", got {spec.build_flags!r}.")
    if spec.archive is not None:
        object.__setattr__(spec, "archive", Path(spec.archive))


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise KitUsageError(f"{name} {value!r} is not one of {', '.join(allowed)}.")


def load_toml(path: Path) -> dict[str, Any]:
    """Flatten a ``trtllm-kit.toml``: top-level keys and those of its ``[build]`` table.

    Arguments:
        path: the file.
    """
    if not path.is_file():
        raise KitUsageError(f"config file {path} does not exist.")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise KitUsageError(f"{path} is not valid TOML ({exc}).") from None
    flat = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = sorted(k for k, v in data.items() if isinstance(v, dict) and k not in TABLES)
    if tables:
        raise KitUsageError(f"{path}: unknown table(s) [{'], ['.join(tables)}]; known tables: "
                            f"[{'], ['.join(TABLES)}].")
    for table in TABLES:
        flat.update(data.get(table, {}))
    known = {f.name for f in fields(BuildSpec)}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise KitUsageError(f"{path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}.")
    return flat


def build_spec(file_values: dict[str, Any], flag_values: dict[str, Any]) -> BuildSpec:
    """Merge a config file's values with the flags the user actually gave (flags override the file).

    Arguments:
        file_values: from ``load_toml`` (or empty).
        flag_values: only the flags given on the command line.
    """
    values = {**file_values, **{k: v for k, v in flag_values.items() if v is not None}}
    if "model" not in values or not values["model"]:
        raise KitUsageError("no model given; pass MODEL or set model = \"...\" in the config file.")
    if "out" not in values:
        raise KitUsageError("no output directory given; pass --out DIR or set out = \"...\" in the config file.")
    return BuildSpec(**values)
