"""``BuildSpec``: everything a build needs, one dataclass per TOML table; its nested dict form (what the manifest
stores) and the upgrade of the flat form that ``schema_version`` 1 manifests hold."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.enums import Stage
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.option import Declared, check_declared, declared, option, table_dict
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.spec.speculative import SpeculativeOptions
from trtllm_kit.spec.tables import BuildOptions, QuantOptions, ServeSettings

STAGES = Stage.values()
TABLES: dict[str, type] = {"build": BuildOptions, "quant": QuantOptions, "repo": RepoOptions, "serve": ServeSettings,
                           "speculative": SpeculativeOptions}
NEAR = 0.6  # difflib ratio from which a key counts as a misspelling of another
FLAT_TABLES = ("build", "quant", "repo")  # the tables whose fields a schema_version 1 spec held at the top level


@dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs to know; the manifest records ``to_dict()``."""

    model: str = field(metadata=option("A model directory, builtin:NAME or a repo id in the local HF cache.",
                                       argument=True))
    out: Path = field(metadata=option("Output directory (created atomically); for plan and --dry-run, the "
                                      "artifact whose stage cache is checked (default there: out/).", "--out"))
    build: BuildOptions = field(default_factory=BuildOptions)
    quant: QuantOptions = field(default_factory=QuantOptions)
    repo: RepoOptions = field(default_factory=RepoOptions)
    serve: ServeSettings = field(default_factory=ServeSettings)
    speculative: SpeculativeOptions = field(default_factory=SpeculativeOptions)

    def __post_init__(self) -> None:
        if not self.model:
            raise KitUsageError("no model given; pass a model directory, a cached repo id or builtin:tiny-llama.")
        if isinstance(self.model, Path):
            object.__setattr__(self, "model", str(self.model))
        check_declared(self, None)
        for name, cls in TABLES.items():
            if not isinstance(getattr(self, name), cls):
                raise KitUsageError(f"[{name}] must be a {cls.__name__}, got {getattr(self, name)!r}.")

    def quant_config(self) -> QuantConfig:
        """The ``[quant]`` table as the quantizer takes it."""
        return self.quant.quant_config()

    def to_dict(self) -> dict[str, Any]:
        """The nested form: ``model``, ``out`` (a string) and one plain dict per table."""
        return {**table_dict(self, None), **{name: table_dict(getattr(self, name), name) for name in TABLES}}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BuildSpec:
        """Read the nested form back (``to_dict``, a merged config file); absent keys take their defaults.

        Arguments:
            values: ``model``, ``out`` and the tables as dicts; an unknown key is refused with the nearest valid one.
        """
        unknown = [key for key in values if key not in TABLES and key not in top_level_keys()]
        if unknown:
            raise KitUsageError(f"unknown spec key {unknown[0]!r}{did_you_mean(unknown[0], None)}")
        tables = {}
        for name, table_cls in TABLES.items():
            table = values.get(name) or {}
            if not isinstance(table, dict):
                raise KitUsageError(f"[{name}] must be a table, got {table!r}.")
            keys = {d.name for d in declared(table_cls, name)}
            for key in table:
                if key not in keys:
                    raise KitUsageError(f"unknown key {key!r} in [{name}]{did_you_mean(key, name)}")
            tables[name] = table_cls(**table)
        return cls(model=values.get("model", ""), out=values.get("out", ""), **tables)


def top_level_keys() -> tuple[str, ...]:
    return tuple(d.name for d in declared(BuildSpec, None))


def all_declared(tables: tuple[str, ...] = tuple(TABLES)) -> tuple[Declared, ...]:
    """Every declared field: the top-level keys, then each table's, in order.

    Arguments:
        tables: the tables to include.
    """
    return declared(BuildSpec, None) + tuple(d for name in tables for d in declared(TABLES[name], name))


def did_you_mean(key: str, table: str | None) -> str:
    """The end of an unknown-key sentence: where the key belongs, the nearest valid key, or the keys of ``table``.

    Arguments:
        key: the unknown key; table: where it was found (None: the top level).
    """
    everywhere = {d.where: d for d in all_declared()}
    owner = [d for d in everywhere.values() if d.name == key]
    if owner:
        return f"; it belongs {'at the top level' if owner[0].table is None else f'in [{owner[0].table}]'}."
    for d in everywhere.values():
        spellings = (d.option.flag or "").split("/")
        if key in (flag.lstrip("-").replace("-", "_") for flag in spellings if flag):
            return f"; did you mean {d.where} (the key of {spellings[0]})?"
    here = [d.name for d in everywhere.values() if d.table == table]
    scored = [(difflib.SequenceMatcher(None, key, d.name).ratio(), d.table == table, d) for d in everywhere.values()]
    ratio, same_table, nearest = max(scored, key=lambda item: item[:2])
    if ratio >= NEAR:
        return f"; did you mean {nearest.name if same_table else nearest.where}?"
    return f"; the keys {'at the top level' if table is None else f'of [{table}]'} are {', '.join(here)}."


def nest_flat_spec(flat: dict[str, Any]) -> dict[str, Any]:
    """The nested form of a ``schema_version`` 1 spec, which held every field at the top level.

    Arguments:
        flat: the old manifest's ``spec``; each key goes to the table that declares it.
    """
    homes = {d.name: d.table for d in all_declared(FLAT_TABLES)}
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        if key not in homes:
            raise KitError(f"the old spec has a key {key!r} that no table declares; rebuild the artifact with "
                           "trtllm-kit build.")
        table = homes[key]
        if table is None:
            nested[key] = value
        else:
            nested.setdefault(table, {})[key] = value
    return nested
