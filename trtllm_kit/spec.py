"""Build specifications: typed, validated, from ``trtllm-kit.toml`` and/or CLI flags (flags win)."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DTYPES = ("auto", "float16", "bfloat16", "float32")
STAGES = ("checkpoint",)
TARGETS = ("auto", "cpu", "engine")
TABLES = ("build",)


@dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs to know; the manifest records it verbatim."""

    model: str
    out: Path
    tp: int = 1
    pp: int = 1
    dtype: str = "auto"
    until: str = "checkpoint"
    target: str = "auto"
    verify: bool | None = None  # None: verify when the model is small enough
    allow_pickle: bool = False
    force: bool = False

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

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["out"] = str(self.out)
        return values


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
