"""What a one-node Ray serving one deployment does without.

Ray starts timers for a cluster's observability (task events for the state API and the timeline, metrics for
Prometheus, node stats for the dashboard). The serve reads none of them: its answers, its autoscaling (the Serve
controller's own counts of requests in flight, pushed by the handle and the replicas) and its logs (the replicas'
files, ``engine_load.py``) do not change. ``RAY_<name>`` overrides a RayConfig entry in every process of Ray's
(``src/ray/common/ray_config_def.h`` of Ray 2.60.0); the others are read by Ray's Python helpers. Ray's processes
keep their bytecode between starts as every process a serve starts does (``kit_environment``).
"""

from __future__ import annotations

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


def ray_environment(base: dict[str, str]) -> dict[str, str]:
    """The driver's environment, which Ray's processes inherit: ``base`` with ``RAY_SETTINGS``.

    Arguments:
        base: the serve's environment (``kit_environment``).
    """
    return {**base, **RAY_SETTINGS}
