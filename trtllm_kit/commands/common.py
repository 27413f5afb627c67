"""What every command shares: JSON output and progress reporting (the flags typed: ``build_flags.typed_values``)."""

from __future__ import annotations

import json
from typing import Any

import click
from click.core import ParameterSource

from trtllm_kit.progress import Reporter, RichReporter


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def reporter_for(as_json: bool) -> Reporter:
    return Reporter() if as_json else RichReporter()



def given(ctx: click.Context, **values: Any) -> dict[str, Any]:
    """Only the options the user actually typed, so a config file's values are not overridden by defaults.

    Arguments:
        ctx: the command's context; values: the command's parameters by name.
    """
    return {k: v for k, v in values.items() if ctx.get_parameter_source(k) is not ParameterSource.DEFAULT}
