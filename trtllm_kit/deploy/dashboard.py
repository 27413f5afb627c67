"""A Grafana dashboard (JSON model) whose panels use the autoscaler's and the recording rules' queries, shipped as a
ConfigMap that Grafana's dashboard sidecar loads (kube-prometheus-stack's ``grafana.sidecar.dashboards``)."""

from __future__ import annotations

import json
from typing import Any

from trtllm_kit.deploy.monitoring import selector, waiting_query
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.settings import DeploySettings

Obj = dict[str, Any]
SIDECAR_LABEL = ("grafana_dashboard", "1")  # what Grafana's sidecar selects by default
DASHBOARD_SUFFIX = "-dashboard"
Panel = tuple[str, str, list[tuple[str, str]]]


def panels(names: Names, settings: DeploySettings) -> list[Panel]:
    """(title, unit, [(legend, query)]) of every panel."""
    sel = selector(names)
    trt = selector(names, model="tensorrt_llm")
    kv = selector(names, kv_cache_block_type="fraction")
    pods = f'namespace="{names.namespace}",pod=~"{names.name}-.*"'

    def quantiles(metric: str) -> list[tuple[str, str]]:
        return [(f"p{q}", f"histogram_quantile(0.{q}, sum by (le) (rate({metric}_bucket{{{sel}}}[5m])))")
                for q in (50, 90, 99)]

    return [
        ("Requests / s", "reqps", [("ok", f"sum(rate(nv_inference_request_success{{{trt}}}[1m]))"),
                                   ("failed", f"sum(rate(nv_inference_request_failure{{{trt}}}[1m]))")]),
        ("Queue (autoscaler signal)", "short", [
            ("waiting", waiting_query(names)),
            ("target x replicas", f"{settings.queue_target:g} * count(count by (pod) (nv_trt_llm_request_metrics"
                                  f'{{{selector(names, request_type="waiting")}}}))'),  # one per serving pod
            ("queue:compute", f'max(trtllm_kit:queue_compute:ratio{{namespace="{names.namespace}"}})')]),
        ("Active requests", "short", [
            ("active", f'sum(nv_trt_llm_request_metrics{{{selector(names, request_type="active")}}})'),
            ("scheduled", f'sum(nv_trt_llm_request_metrics{{{selector(names, request_type="scheduled")}}})')]),
        ("KV-cache use", "percentunit", [("used fraction", f"avg(nv_trt_llm_kv_cache_block_metrics{{{kv}}})")]),
        ("Time to first token (OpenAI)", "s", quantiles("trtllm_kit_openai_time_to_first_token_seconds")),
        ("Inter-token latency (OpenAI)", "s", quantiles("trtllm_kit_openai_inter_token_latency_seconds")),
        ("Errors / s", "reqps", [("OpenAI", f"sum(rate(trtllm_kit_openai_errors_total{{{sel}}}[1m]))"),
                                 ("Triton", f"sum(rate(nv_inference_request_failure{{{sel}}}[1m]))")]),
        ("GPU use (DCGM exporter)", "percent", [("util", f"avg(DCGM_FI_DEV_GPU_UTIL{{{pods}}})"),
                                                ("memory", f"avg(DCGM_FI_DEV_FB_USED{{{pods}}} / "
                                                           f"(DCGM_FI_DEV_FB_USED{{{pods}}} + "
                                                           f"DCGM_FI_DEV_FB_FREE{{{pods}}})) * 100")]),
    ]


def dashboard(names: Names, settings: DeploySettings) -> Obj:
    """The dashboard model for Grafana's import (a Prometheus data source chosen on import).

    Arguments:
        names: the deployment; settings: the queue target drawn next to the queue.
    """
    return dashboard_model(names, panels(names, settings))


def dashboard_model(names: Names, panel_list: list[Panel]) -> Obj:
    """A Grafana dashboard of ``panel_list``, two panels a row.

    Arguments:
        names: the deployment (title, uid); panel_list: (title, unit, [(legend, query)]) of every panel.
    """
    body = []
    for index, (title, unit, targets) in enumerate(panel_list):
        body.append({
            "id": index + 1, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                        for i, (legend, expr) in enumerate(targets)]})
    return {"title": f"trtllm-kit {names.namespace}/{names.name}", "uid": f"trtllm-kit-{names.name}"[:40],
            "schemaVersion": 39, "editable": True, "time": {"from": "now-1h", "to": "now"}, "refresh": "10s",
            "tags": ["trtllm-kit"], "panels": body,
            "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                     "label": "Prometheus"}]}}


def dashboard_config_map(names: Names, model: Obj) -> Obj:
    """A ConfigMap holding the dashboard ``model`` as ``<name>.json``, labelled for Grafana's sidecar.

    Arguments:
        names: the deployment; model: the dashboard (``dashboard`` or Dynamo's).
    """
    meta = names.meta(DASHBOARD_SUFFIX)
    meta["labels"][SIDECAR_LABEL[0]] = SIDECAR_LABEL[1]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {f"trtllm-kit-{names.name}.json": json.dumps(model, indent=2) + "\n"}}
