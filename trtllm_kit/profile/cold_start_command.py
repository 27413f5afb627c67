"""``bench cold-start``: one start of a build output here, phase by phase (``profile/cold_start.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command(name="cold-start")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--prompt", default="The capital of France is", show_default=True, help="The warm-up's and the timed "
              "request's prompt.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True, help="Seconds the server may "
              "take to become ready.")
@click.option("--json", "as_json", is_flag=True, help="Print the phases as JSON.")
def cold_start(out: Path, prompt: str, timeout_s: float, as_json: bool) -> None:
    """Start OUT (a trtllm-kit build output) once from its tar, as a pod does, and time each phase: artifact
    fetch, weight read (from disk), runtime init, warm-up, first token.

    \b
    Example:
      trtllm-kit bench cold-start out/ --json
      trtllm-kit plan ./Meta-Llama-3-8B --gpu H100 --cold-start --load-gbps 2   (the same phases on a GPU)
    """
    from trtllm_kit.profile.cold_start import measure_cold_start

    measured = measure_cold_start(out, prompt=prompt, timeout_s=timeout_s)
    if as_json:
        click.echo(json.dumps(measured.to_dict(), indent=2))
    else:
        click.echo(measured.line())
