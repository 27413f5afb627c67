"""``deploy simulate``: the autoscaler of a deploy directory replayed on recorded metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from trtllm_kit.commands.output import emit_json
from trtllm_kit.errors import KitUsageError


@click.command(name="simulate")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--series", type=click.Path(path_type=Path), help="A series file written by --save.")
@click.option("--prometheus", "prometheus_url", help="Query this Prometheus for the autoscaler's series instead.")
@click.option("--start", type=float, help="Unix time to start at (with --prometheus; default an hour ago).")
@click.option("--end", type=float, help="Unix time to end at (with --prometheus; default now).")
@click.option("--step", type=float, default=5.0, show_default=True, help="Seconds between samples (--prometheus).")
@click.option("--extend", type=float, default=0.0, help="Replay this many seconds past the series, its last value "
              "holding.")
@click.option("--save", type=click.Path(path_type=Path), help="Write the queried series to this file.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write the replay as a PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the replay as JSON.")
def simulate(directory: Path, series: Path | None, prometheus_url: str | None, start: float | None,
             end: float | None, step: float, extend: float, save: Path | None, plot: Path | None,
             as_json: bool) -> None:
    """Replay the autoscaler of DIRECTORY on recorded metrics: replicas over time, next to the load.

    \b
    Example:
      trtllm-kit deploy simulate k8s/ --prometheus http://127.0.0.1:9090 --save series.json --plot scale.png
      trtllm-kit deploy simulate k8s/ --series series.json --extend 900 --plot docs/scale-out.png
    """
    from trtllm_kit.deploy.replay_plot import plot_replay
    from trtllm_kit.deploy.simulate import replay, scaling_spec

    spec = scaling_spec(directory)
    if (series is None) == (prometheus_url is None):
        raise KitUsageError("give the metrics either as --series FILE or as --prometheus URL.")
    if series is not None:
        try:
            body = json.loads(series.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise KitUsageError(f"--series {series} cannot be read as JSON ({exc}); pass a file written by "
                                "--save.") from None
    else:
        assert prometheus_url is not None, "one of --series and --prometheus is given"
        body = _query_series(directory, spec.query, prometheus_url, start, end, step)
    if save is not None:
        save.write_text(json.dumps(body) + "\n")
    signal = [(float(t), float(v)) for t, v in body["signal"]]
    until = signal[-1][0] + extend if signal else None
    steps = replay(signal, spec, until=until)
    if plot is not None:
        plot_replay(steps, spec, [(float(t), float(v)) for t, v in body.get("load", [])], plot,
                    title=f"{body.get('query', '')} (target {spec.target:g} per replica)")
    peak = max(s.replicas for s in steps)
    if as_json:
        emit_json({"query": body.get("query"), "target": spec.target, "peak_replicas": peak,
                   "steps": [{"t": s.t, "value": s.value, "recommended": s.recommended, "replicas": s.replicas}
                             for s in steps]})
    else:
        click.echo(f"{len(steps)} syncs over {(steps[-1].t - steps[0].t) / 60:.1f} min: replicas "
                   f"{steps[0].replicas} → peak {peak} → {steps[-1].replicas}" + (f"; plot {plot}" if plot else ""))


def _query_series(directory: Path, signal_query: str | None, url: str, start: float | None, end: float | None,
                  step: float) -> dict[str, Any]:
    from trtllm_kit.deploy.monitoring import RECORDED_PER_POD, load_query
    from trtllm_kit.deploy.objects import Names
    from trtllm_kit.deploy.prometheus import query_range
    from trtllm_kit.deploy.render import RECORD

    record = json.loads((directory / RECORD).read_text())
    names = Names(record["name"], record["namespace"])
    end = end if end is not None else time.time()
    start = start if start is not None else end - 3600
    query = signal_query or f'sum({RECORDED_PER_POD}{{namespace="{names.namespace}"}})'
    return {"query": query, "step_s": step, "signal": query_range(url, query, start, end, step),
            "load": query_range(url, load_query(names), start, end, step)}
