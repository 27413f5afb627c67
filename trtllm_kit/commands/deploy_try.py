"""``deploy try``: the pods of a deploy directory run on this machine as a kubelet would."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_kit.commands.output import emit_json
from trtllm_kit.errors import KitError, KitUsageError


@click.command(name="try")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--pvc-dir", "pvc_dirs", multiple=True, metavar="NAME=PATH", help="The directory standing for the "
              "PersistentVolumeClaim NAME (with deploy k8s --pvc NAME: the build output); repeatable.")
@click.option("--timeout", "timeout_s", type=float, help="Seconds the pods may take to become ready (default: the "
              "startup budget the directory records, and a minute).")
@click.option("--prompt", default="The capital of France is", show_default=True, help="The completion request's "
              "prompt, sent through the clients' Service.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def try_pods(directory: Path, pvc_dirs: tuple[str, ...], timeout_s: float | None, prompt: str,
             as_json: bool) -> None:
    """Run the pods a deploy k8s directory describes on this machine, as a kubelet would: each pod in network and
    mount namespaces of its own with only its volumes, init containers then containers, probes as written, one
    OpenAI request through the Service, then preStop, SIGTERM and the grace period. Needs root; the image is
    replaced by this machine's environment.

    \b
    Example:
      trtllm-kit deploy k8s out/ --out k8s/ --image IMG --pvc models
      sudo trtllm-kit deploy try k8s/ --pvc-dir models=out/
    """
    from trtllm_kit.deploy.try_.try_directory import try_directory

    claims = {}
    for text in pvc_dirs:
        name, sep, path = text.partition("=")
        if not sep or not name or not Path(path).is_dir():
            raise KitUsageError(f"--pvc-dir {text!r} is not NAME=DIRECTORY of an existing directory; write e.g. "
                                "--pvc-dir models=out/.")
        claims[name] = Path(path).absolute()
    report = try_directory(directory, claims, prompt=prompt, timeout_s=timeout_s)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(report.image)
        for pod in report.pods:
            ready = f"ready after {pod.ready_after_s} s" if pod.ready_after_s is not None else "not ready"
            click.echo(f"pod {pod.name} ({pod.address}): {ready}")
            for probe in pod.probes:
                passed = "never passed" if probe.passed_after_s is None else f"passed after {probe.passed_after_s} s"
                click.echo(f"  {probe.container} {probe.description}: {passed}, {probe.failures} failure(s), "
                           f"last {probe.last}")
            for stop in pod.stopped:
                click.echo(f"  {stop.container} stopped after {stop.stopped_after_s} s (exit {stop.exit_code}"
                           f"{', killed' if stop.killed else ''})")
        if report.cold_start is not None:
            cold = report.cold_start
            click.echo(f"scaled from zero: the first request was held {cold.held_s} s (the plan predicts "
                       f"{cold.predicted_s} s, within a budget of {cold.budget_s} s)")
        if report.answer is not None:
            click.echo(f"Service {report.service} answered: {report.answer!r}")
    if report.failure is not None:
        raise KitError(f"deploy try failed: {report.failure}")
