"""The spec's options as click flags, generated from their declarations (``trtllm_kit.option``), and the values
the user typed read back nested by table. ``build``, ``plan``, ``build --dry-run``, ``inspect`` and ``serve``
share them; no flag of a spec field is written by hand."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from trtllm_kit.enums import Choice
from trtllm_kit.option import Declared, SharedFlag, plain
from trtllm_kit.spec import all_declared
from trtllm_kit.spec.repo_options import INSTANCES

SHARED_FLAGS = (INSTANCES,)


def declared_fields(*tables: str, skip: Iterable[str] = (), only: Iterable[str] | None = None,
                    top_level: bool = True) -> list[Declared]:
    """The declared fields of ``tables`` (and the top-level keys), minus ``skip``, or just ``only``.

    Arguments:
        tables: table names; skip/only: fields as ``table.name`` (or ``name`` at the top level);
        top_level: include ``model`` and ``out``.
    """
    skipped, wanted = set(skip), None if only is None else set(only)
    chosen = []
    for d in all_declared(tables):
        key = f"{d.table}.{d.name}" if d.table else d.name
        if (d.table is None and not top_level) or key in skipped or (wanted is not None and key not in wanted):
            continue
        chosen.append(d)
    return chosen


def click_param(d: Declared) -> Callable[[Any], Any]:
    """The click option (or argument) a declaration generates: name, type, default shown, help.

    Arguments:
        d: the declared field.
    """
    o = d.option
    if o.argument:
        return click.argument(d.param, required=False)
    assert o.flag, f"{d.where} has no flag"
    settings: dict[str, Any] = {"help": o.help, "metavar": o.metavar}
    if d.kind is bool and "/" not in o.flag:
        settings.update(is_flag=True, default=False)
    elif d.kind is bool:
        settings.update(default=d.default, show_default=d.default is not None)
    elif o.multiple:
        settings.update(multiple=True, type=str)
    else:
        kind = (click.Choice(d.kind.values()) if issubclass(d.kind, Choice) else
                click.Path(path_type=Path) if d.kind is Path else d.kind)
        settings.update(type=kind, default=plain(d.default), show_default=d.default is not None)
    return click.option(o.flag, d.param, **settings)


def shared_param(shared: SharedFlag) -> Callable[[Any], Any]:
    return click.option(shared.flag, shared.param, type=shared.kind, help=shared.help)


def config_option(help: str = "trtllm-kit.toml; flags override it.") -> Callable[[Any], Any]:
    return click.option("--config", "config_file", type=click.Path(path_type=Path), help=help)


def spec_options(fields: Iterable[Declared], *, shared: Iterable[SharedFlag] = (),
                 config: bool = True) -> Callable[[Any], Any]:
    """A decorator adding the flags of ``fields`` (and ``--config`` after the top-level ones) to a command.

    Arguments:
        fields: from ``declared_fields``; shared: flags setting several fields; config: add ``--config``.
    """
    chosen = [d for d in fields if d.option.flag or d.option.argument]  # the others are config-file keys
    params = [click_param(d) for d in chosen if d.table is None]
    params += [config_option()] if config else []
    params += [click_param(d) for d in chosen if d.table is not None]
    params += [shared_param(s) for s in shared]

    def decorate(command: Any) -> Any:
        for param in reversed(params):
            command = param(command)
        return command

    return decorate


def typed_values(ctx: click.Context) -> dict[str, Any]:
    """The declared options the user typed (defaults left out, so a config file's values stand), nested by
    table as ``BuildSpec.from_dict`` reads them.

    Arguments:
        ctx: the command's context.
    """
    lookup = {d.param: d for d in all_declared()}
    shared = {s.param: s for s in SHARED_FLAGS}
    nested: dict[str, Any] = {}
    for name, value in ctx.params.items():
        if ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT) or value is None:
            continue
        if name in lookup:
            d = lookup[name]
            value = d.option.parse(value) if d.option.parse else value
            if d.table is None:
                nested[d.name] = value
            else:
                nested.setdefault(d.table, {})[d.name] = value
        elif name in shared:
            nested.setdefault(shared[name].table, {}).update(dict.fromkeys(shared[name].names, value))
    return nested


def given(ctx: click.Context, **values: Any) -> dict[str, Any]:
    """Only the options the user actually typed, so a config file's values are not overridden by defaults.

    Arguments:
        ctx: the command's context; values: the command's parameters by name.
    """
    return {k: v for k, v in values.items() if ctx.get_parameter_source(k) is not ParameterSource.DEFAULT}
