"""Prometheus's HTTP API (instant and range queries), and a local Prometheus scraping given targets.

The local one is what tests and ``benchmarks/scale_out.py`` run: Debian's ``prometheus`` binary with a
temporary configuration, listening on 127.0.0.1, scraping a real tritonserver and evaluating the deployment's
recording rules.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.http_probe import answers


def _get(url: str, path: str, params: dict[str, Any], timeout_s: float = 10.0) -> Any:
    full = f"{url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except OSError as exc:
        raise KitError(f"Prometheus at {url} does not answer ({exc}); check --prometheus.") from None
    if body.get("status") != "success":
        raise KitUsageError(f"Prometheus refused {params.get('query')!r}: {body.get('error')}; fix the query.")
    return body["data"]


def query(url: str, promql: str) -> float | None:
    """The value of a query that returns one element now (None when it returns nothing).

    Arguments:
        url: Prometheus's base URL; promql: the query.
    """
    data = _get(url, "/api/v1/query", {"query": promql})
    if data["resultType"] == "scalar":
        return float(data["result"][1])
    return float(data["result"][0]["value"][1]) if data["result"] else None


def query_range(url: str, promql: str, start: float, end: float, step_s: float) -> list[tuple[float, float]]:
    """(time, value) of a one-element query between ``start`` and ``end`` (absent steps are left out).

    Arguments:
        url: Prometheus's base URL; promql: the query; start, end: unix times; step_s: the resolution.
    """
    data = _get(url, "/api/v1/query_range", {"query": promql, "start": start, "end": end, "step": step_s})
    if not data["result"]:
        return []
    if len(data["result"]) > 1:
        raise KitUsageError(f"{promql!r} returns {len(data['result'])} series; the autoscaler needs one (sum it).")
    return [(float(t), float(v)) for t, v in data["result"][0]["values"] if not math.isnan(float(v))]


def duration(seconds: float) -> str:
    """``seconds`` as a Prometheus duration, in whole milliseconds (it takes no fractions: ``0.5s`` is refused).

    Arguments:
        seconds: at least a millisecond.
    """
    if round(seconds * 1000) < 1:
        raise KitUsageError(f"a Prometheus interval of {seconds:g} s is under its resolution of 1 ms.")
    return f"{round(seconds * 1000)}ms"


class LocalPrometheus:
    """A ``prometheus`` process on 127.0.0.1 scraping ``targets`` every ``scrape_s`` and evaluating ``rule_files``.

    Arguments:
        port: the listen port; targets: ``host:port`` to scrape with their extra labels;
        rules: a rules file body (``groups: [...]``) or None; scrape_s: the scrape and evaluation interval.
    """

    def __init__(self, port: int, targets: list[tuple[str, dict[str, str]]], rules: dict[str, Any] | None = None,
                 scrape_s: float = 1.0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise KitUsageError("prometheus is not on PATH; install it (Debian: apt-get install prometheus).")
        self.binary, self.port, self.url = binary, port, f"http://127.0.0.1:{port}"
        self.dir = Path(tempfile.mkdtemp(prefix="trtllm-kit-prometheus."))
        config: dict[str, Any] = {
            "global": {"scrape_interval": duration(scrape_s), "evaluation_interval": duration(scrape_s)},
            "scrape_configs": [{"job_name": "trtllm-kit", "static_configs": [
                {"targets": [target], "labels": labels} for target, labels in targets]}]}
        if rules is not None:
            (self.dir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
            config["rule_files"] = [str(self.dir / "rules.yaml")]
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> LocalPrometheus:
        """Start and wait until ``/-/ready`` answers."""
        log = (self.dir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KitError(f"prometheus exited with {self.process.returncode}: "
                               f"{(self.dir / 'prometheus.log').read_text()[-500:]}")
            if answers(f"{self.url}/-/ready"):
                return self
            time.sleep(0.2)
        self.stop()
        raise KitError(f"prometheus on port {self.port} was not ready after {timeout_s:g} s.")

    def stop(self) -> None:
        """End the process and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
