"""``trtllm-kit.toml``: read its tables (unknown keys refused with the nearest valid one) and merge it with
the flags the user typed into a ``BuildSpec``."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.option import declared
from trtllm_kit.spec.build_spec import TABLES, BuildSpec, did_you_mean, top_level_keys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RESERVED_TABLES = ("deploy",)  # read by their own commands (load_table), not part of the build spec
MOVED_TABLES = {"engine": "build"}  # tables of older files, and where their keys went


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise KitUsageError(f"config file {path} does not exist.")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise KitUsageError(f"{path} is not valid TOML ({exc}).") from None


def load_toml(path: Path) -> dict[str, Any]:
    """The spec part of a ``trtllm-kit.toml`` in the nested form: ``model``, ``out`` and the tables it sets.

    Arguments:
        path: the file; unknown tables and keys, and keys in the wrong table, are usage errors.
    """
    data = _read(path)
    known = (*TABLES, *RESERVED_TABLES)
    for name, value in data.items():
        if name in MOVED_TABLES and isinstance(value, dict):
            moved = ", ".join(k if not isinstance(v, dict) else f"[{name}.{k}]" for k, v in value.items())
            raise KitUsageError(f"{path}: the [{name}] table is no longer read; its keys ({moved}) belong in "
                                f"[{MOVED_TABLES[name]}]: rename [{name}] to [{MOVED_TABLES[name]}] (and "
                                f"[{name}.build_flags] to [{MOVED_TABLES[name]}.build_flags]).")
        if isinstance(value, dict) and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean [{close[0]}]?" if close else f"the tables are [{'], ['.join(known)}]."
            raise KitUsageError(f"{path}: unknown table [{name}]; {hint}")
        if name in known and not isinstance(value, dict):
            raise KitUsageError(f"{path}: {name} must be a table ([{name}]), got {value!r}.")
        if not isinstance(value, dict) and name not in top_level_keys():
            raise KitUsageError(f"{path}: unknown key {name} at the top level{did_you_mean(name, None)}")
    for name, cls in TABLES.items():
        keys = {d.name for d in declared(cls, name)}
        for key in data.get(name, {}):
            if key not in keys:
                raise KitUsageError(f"{path}: unknown key {key} in [{name}]{did_you_mean(key, name)}")
    return {k: v for k, v in data.items() if k not in RESERVED_TABLES}


def load_table(path: Path, name: str) -> dict[str, Any]:
    """One table of a ``trtllm-kit.toml`` as TOML holds it, unvalidated (empty when absent): for commands with
    tables of their own, such as ``[deploy]``.

    Arguments:
        path: the file; name: the table.
    """
    table = _read(path).get(name, {})
    if not isinstance(table, dict):
        raise KitUsageError(f"{path}: {name} must be a table ([{name}]), got {table!r}.")
    return table


def merge(file_values: dict[str, Any], flag_values: dict[str, Any]) -> dict[str, Any]:
    """The nested values of a file with the flags the user typed laid over them, table by table.

    Arguments:
        file_values: from ``load_toml`` (or empty); flag_values: nested, only the flags given (None: not given).
    """
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in file_values.items()}
    for key, value in flag_values.items():
        if isinstance(value, dict):
            merged.setdefault(key, {}).update({k: v for k, v in value.items() if v is not None})
        elif value is not None:
            merged[key] = value
    return merged


def build_spec(file_values: dict[str, Any], flag_values: dict[str, Any]) -> BuildSpec:
    """Merge a config file's values with the flags the user actually gave (flags override the file).

    Arguments:
        file_values: from ``load_toml`` (or empty).
        flag_values: only the flags given on the command line, nested as the file.
    """
    values = merge(file_values, flag_values)
    if not values.get("model"):
        raise KitUsageError("no model given; pass MODEL or set model = \"...\" in the config file.")
    if "out" not in values:
        raise KitUsageError("no output directory given; pass --out DIR or set out = \"...\" in the config file.")
    return BuildSpec.from_dict(values)
