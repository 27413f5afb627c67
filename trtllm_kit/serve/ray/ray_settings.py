"""The private Ray's environment: Python's bytecode kept between starts, and what a one-node Ray serving one
deployment does without.

Every process of Ray's that runs Python (the driver, the dashboard and its agent, the runtime-env agent, the log
monitor, the autoscaler's monitor, the Serve controller, each replica) imports ``ray``, most of them torch or
transformers too. Under ``PYTHONDONTWRITEBYTECODE`` (``kit_environment``'s, for the Triton stubs) in an environment
installed without bytecode, each of them compiled those packages from source at every start. Ray's processes
instead write their bytecode to a prefix tree of the kit's cache (``PYTHONPYCACHEPREFIX``), never beside a source:
no ``__pycache__`` lands in the hashed artifact or in site-packages, and each start after the first reads it.

Ray also starts timers for a cluster's observability (task events for the state API and the timeline, metrics for
Prometheus, node stats for the dashboard). The serve reads none of them: its answers, its autoscaling (the Serve
controller's own counts of requests in flight, pushed by the handle and the replicas) and its logs (the replicas'
files, ``engine_load.py``) do not change. ``RAY_<name>`` overrides a RayConfig entry in every
process of Ray's (``src/ray/common/ray_config_def.h`` of Ray 2.60.0); the others are read by Ray's Python helpers.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.serve.server.state import kit_cache

PYCACHE = "pycache"  # under the kit's cache: the bytecode of Ray's processes, by source path

RAY_SETTINGS: dict[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage report to Anyscale
    # every worker reports its tasks' state changes to the GCS each second, for `ray list tasks` and the timeline;
    # 0 turns the reports off
    "RAY_task_events_report_interval_ms": "0",
    "RAY_enable_timeline": "false",
    # the GCS, raylet and workers record metrics and export them to the dashboard agent for Prometheus; the
    # replicas export none of their own (docs/ray.md) and Serve's autoscaling does not read them
    "RAY_enable_metrics_collection": "false",
    # per-handler event loop statistics of the GCS, raylet and workers, logged each minute
    "RAY_event_stats": "false",
    # the dashboard agent's reporter reads every process's CPU and memory each 5 s for the dashboard, which is not
    # started; Ray has no switch for the module, so it reads once at start and then once an hour
    "REPORTER_UPDATE_INTERVAL_MS": str(3_600_000),
}


def ray_environment(base: dict[str, str], cache: Path | None = None) -> dict[str, str]:
    """The driver's environment, which Ray's processes inherit: ``base`` with bytecode written under the kit's
    cache and ``RAY_SETTINGS``.

    Arguments:
        base: the serve's environment (``kit_environment``); cache: the kit's cache (``kit_cache()`` when omitted).
    """
    env = {name: value for name, value in base.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str((cache or kit_cache()) / PYCACHE)
    return {**env, **RAY_SETTINGS}
