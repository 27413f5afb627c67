"""What commands print: a value as JSON, and the progress reporter (silent for ``--json``, bars on stderr otherwise)."""

from __future__ import annotations

import json
from typing import Any

import click

from trtllm_kit.progress import Reporter, RichReporter


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def reporter_for(as_json: bool) -> Reporter:
    return Reporter() if as_json else RichReporter()
