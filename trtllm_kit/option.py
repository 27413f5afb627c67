"""One declaration per option: a spec field's metadata, from which its flag, TOML key, help and default follow.

A field is declared once, in the dataclass of its TOML table::

    tp: int = field(default=1, metadata=option("Tensor-parallel size.", "--tp", minimum=1))

``declared(cls)`` reads those declarations back (name, table, type, default, flag); the CLI generates its
options from them (``commands/build_flags.py``), ``check_declared`` validates a table's values by type and
``table_dict`` writes a table as plain JSON/TOML values. A field without ``option`` metadata is internal (not
a key, not a flag).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

from trtllm_kit.enums import Choice
from trtllm_kit.errors import KitUsageError

OPTION_KEY = "trtllm_kit.option"
KINDS = (bool, int, float, str, Path, dict)


@dataclass(frozen=True)
class Option:
    """How one field is offered: its help, its flag (None: config file only) and how a flag value is read."""

    help: str
    flag: str | None = None  # "--tp", or "--streaming/--no-streaming" for a boolean pair
    minimum: int | None = None  # for integers: the smallest valid value
    metavar: str | None = None
    multiple: bool = False  # a repeatable flag; ``parse`` turns the values into the field's value
    parse: Callable[[Any], Any] | None = None
    argument: bool = False  # a positional argument rather than a flag


def option(help: str, flag: str | None = None, **settings: Any) -> dict[str, Option]:
    """Field metadata declaring an option.

    Arguments:
        help: the ``--help`` text; flag: the command-line spelling (None: only a TOML key);
        settings: the other ``Option`` fields (``minimum``, ``metavar``, ``multiple``, ``parse``, ``argument``).
    """
    return {OPTION_KEY: Option(help, flag, **settings)}


@dataclass(frozen=True)
class Declared:
    """A declared field, as the CLI, the TOML reader and the validators see it."""

    table: str | None  # None: a top-level key
    name: str
    kind: type  # bool, int, float, str, Path, dict or a Choice subclass
    optional: bool  # None is a valid value (meaning "derive it")
    default: Any
    option: Option

    @property
    def param(self) -> str:
        """The click parameter name, unique across tables."""
        return f"{self.table}__{self.name}" if self.table else self.name

    @property
    def where(self) -> str:
        """The TOML location, e.g. ``[build] tp``."""
        return f"[{self.table}] {self.name}" if self.table else self.name


@dataclass(frozen=True)
class SharedFlag:
    """One flag that sets several fields of a table to the same value (``--instances``)."""

    flag: str
    table: str
    names: tuple[str, ...]
    kind: type
    help: str

    @property
    def param(self) -> str:
        return f"{self.table}__{self.flag.lstrip('-').replace('-', '_')}"


@functools.cache
def declared(cls: type, table: str | None) -> tuple[Declared, ...]:
    """The declared fields of a dataclass, in order.

    Arguments:
        cls: the table's dataclass; table: its TOML table name (None for top-level keys).
    """
    hints = typing.get_type_hints(cls)
    result = []
    for f in fields(cls):
        spec = f.metadata.get(OPTION_KEY)
        if spec is None:
            continue
        kind, optional = _kind(hints[f.name])
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else None)
        result.append(Declared(table, f.name, kind, optional, default, spec))
    return tuple(result)


def _kind(hint: Any) -> tuple[type, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (UnionType, typing.Union):
        kinds = [a for a in args if a is not NoneType]
        assert len(kinds) == 1, f"a declared field has one type besides None, got {hint}"
        return _kind(kinds[0])[0], NoneType in args
    kind = typing.get_origin(hint) or hint
    assert kind in KINDS or issubclass(kind, Choice), f"no declared field of type {hint}"
    return kind, False


def check_declared(obj: Any, table: str | None) -> None:
    """Validate (and coerce: enums from strings, paths from strings, floats from ints) every declared field.

    Arguments:
        obj: a frozen dataclass instance being built; table: its TOML table.
    """
    cls: type = type(obj)
    for d in declared(cls, table):
        value = getattr(obj, d.name)
        if value is None and d.optional:
            continue
        object.__setattr__(obj, d.name, _checked(d, value))


def _checked(d: Declared, value: Any) -> Any:
    if isinstance(d.kind, type) and issubclass(d.kind, Choice):
        return d.kind.parse(d.name, value)
    if d.kind is bool:
        if not isinstance(value, bool):
            raise KitUsageError(f"{d.name} must be true or false, got {value!r}.")
    elif d.kind is int:
        low = d.option.minimum
        if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
            what = "a positive integer" if low == 1 else f"an integer >= {low}" if low is not None else "an integer"
            raise KitUsageError(f"{d.name} must be {what}, got {value!r}.")
    elif d.kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise KitUsageError(f"{d.name} must be a number, got {value!r}.")
        return float(value)
    elif d.kind is Path:
        if not isinstance(value, str | Path) or not str(value):
            raise KitUsageError(f"{d.name} must be a path, got {value!r}.")
        return Path(value)
    elif not isinstance(value, d.kind):
        raise KitUsageError(f"{d.name} must be {'a table' if d.kind is dict else 'a string'}, got {value!r}.")
    return value


def plain(value: Any) -> Any:
    """A field value as JSON and TOML hold it: enums as their string, paths as strings, tables copied."""
    if isinstance(value, Choice):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return dict(value) if isinstance(value, dict) else value


def table_dict(obj: Any, table: str | None) -> dict[str, Any]:
    """The declared fields of ``obj`` as plain values, in declaration order.

    Arguments:
        obj: a table's dataclass instance; table: its TOML table.
    """
    cls: type = type(obj)
    return {d.name: plain(getattr(obj, d.name)) for d in declared(cls, table)}
