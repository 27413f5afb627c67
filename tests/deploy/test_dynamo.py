"""``deploy dynamo``: DynamoGraphDeployments validated against Dynamo's saved CRD, worker argv as upstream's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trtllm_kit.cli import run
from trtllm_kit.deploy.dynamo import frontend_args
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.deploy.validate import check_object

DGD = {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment", "metadata": {"name": "m"},
       "spec": {"backendFramework": "trtllm",
                "components": [{"name": "Frontend", "type": "frontend", "replicas": 1,
                                "podTemplate": {"spec": {"containers": [{"name": "main", "image": "img"}]}}}]}}


def test_saved_crd_accepts_upstream_shape_and_refuses_unknown_fields() -> None:
    assert check_object(DGD, "dgd.yaml") == []
    bad: dict[str, Any] = {**DGD, "spec": {**DGD["spec"], "services": {}}}
    [finding] = check_object(bad, "dgd.yaml")
    assert "services" in finding.message
    wrong_type = {**DGD, "spec": {**DGD["spec"], "components": [{"name": "x", "type": "router"}]}}
    assert any("router" in f.message for f in check_object(wrong_type, "dgd.yaml"))


IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.3.1"
CHECKPOINT = "/models/llama70b/checkpoint"


def dynamo(art: Path, out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = run(["deploy", "dynamo", str(art), "--out", str(out), "--image", IMAGE, "--pvc", "models", "--json",
                *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def graph(out: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """(the DGD, its components by name, the engine options by file) as written."""
    [dgd] = yaml.safe_load_all((out / "dynamographdeployment.yaml").read_text())
    [config] = yaml.safe_load_all((out / "engine-configmap.yaml").read_text())
    options = {name: yaml.safe_load(text) for name, text in config["data"].items()}
    return dgd, {c["name"]: c for c in dgd["spec"]["components"]}, options


def main(component: dict[str, Any]) -> dict[str, Any]:
    [container] = component["podTemplate"]["spec"]["containers"]
    assert container["name"] == "main"
    return container


def worker_argv(component: dict[str, Any]) -> list[str]:
    container = main(component)
    return [*container["command"], *container["args"]]


def test_aggregated_graph_validates_and_runs_the_artifact(artifact, tmp_path, capsys):
    out = tmp_path / "dgd"
    written = dynamo(artifact(target="llmapi", tp=2, pp=1), out, capsys, "--replicas", "2")
    assert written["roles"] == [{"name": "TRTLLMWorker", "type": "worker", "replicas": 2, "tp_size": 2,
                                 "pp_size": 1}]
    assert check_dir(out) == (6, [])  # with the dashboard ConfigMap
    dgd, components, options = graph(out)
    assert (dgd["apiVersion"], dgd["kind"], dgd["spec"]["backendFramework"]) == \
        ("nvidia.com/v1beta1", "DynamoGraphDeployment", "trtllm")
    assert [(c["name"], c["type"], c["replicas"]) for c in dgd["spec"]["components"]] == \
        [("Frontend", "frontend", 1), ("TRTLLMWorker", "worker", 2)]
    assert worker_argv(components["Frontend"]) == ["python3", "-m", "dynamo.frontend", "--http-port", "8000",
                                                   "--router-mode", "kv", "--router-kv-overlap-score-credit", "4",
                                                   "--migration-limit", "3"]
    assert worker_argv(components["TRTLLMWorker"]) == [
        "python3", "-m", "dynamo.trtllm", "--model", CHECKPOINT, "--served-model-name",
        "meta-llama/Llama-3.1-70B-Instruct", "--extra-engine-args", "/etc/trtllm-kit/engine/TRTLLMWorker.yaml",
        "--publish-kv-events"]
    assert options["TRTLLMWorker.yaml"] == {
        "backend": "pytorch", "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "enable_iter_perf_stats": True,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9}}
    pod = components["TRTLLMWorker"]["podTemplate"]["spec"]
    [fetch] = pod["initContainers"]
    assert fetch["args"][0].endswith("sha256sum --check --quiet --strict /etc/trtllm-kit/SHA256SUMS")
    assert main(components["TRTLLMWorker"])["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "multinode" not in components["TRTLLMWorker"]
    [monitor] = yaml.safe_load_all((out / "podmonitor.yaml").read_text())
    assert [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]] == \
        [("http", "/metrics"), ("system", "/metrics")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        components["TRTLLMWorker"]["podTemplate"]["metadata"]["labels"].items()
    [config_map] = yaml.safe_load_all((out / "dashboard-configmap.yaml").read_text())
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    [board] = [json.loads(text) for text in config_map["data"].values()]
    queries = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert 'histogram_quantile(0.99, sum by (le) (rate(dynamo_frontend_inter_token_latency_seconds_bucket{namespace=' \
        '"default",app="llama-3-1-70b-instruct"}[5m])))' in queries


def test_disaggregated_graph_sets_the_roles_as_upstream(artifact, tmp_path, capsys):
    out = tmp_path / "dgd"
    dynamo(artifact(target="llmapi", tp=2, pp=1), out, capsys, "--disagg", "--prefill-replicas", "3",
           "--decode-replicas", "1", "--prefill-tp", "1", "--decode-tp", "4")
    assert check_dir(out) == (7, [])
    _, components, options = graph(out)
    assert [(n, c.get("type"), c["replicas"]) for n, c in components.items()] == \
        [("Frontend", "frontend", 1), ("prefill", "prefill", 3), ("decode", "decode", 1)]
    for role, publish in (("prefill", ["--publish-kv-events"]), ("decode", [])):  # the router picks prefill's
        assert worker_argv(components[role]) == [
            "python3", "-m", "dynamo.trtllm", "--model", CHECKPOINT, "--served-model-name",
            "meta-llama/Llama-3.1-70B-Instruct", "--extra-engine-args", f"/etc/trtllm-kit/engine/{role}.yaml",
            "--disaggregation-mode", role, *publish]
    prefill, decode = options["prefill.yaml"], options["decode.yaml"]
    assert (prefill["disable_overlap_scheduler"], decode["disable_overlap_scheduler"]) == (True, False)
    assert prefill["cache_transceiver_config"] == decode["cache_transceiver_config"] == \
        {"backend": "UCX", "max_tokens_in_buffer": 8192}
    assert prefill["kv_cache_config"]["dtype"] == decode["kv_cache_config"]["dtype"] == "auto"
    assert (prefill["tensor_parallel_size"], decode["tensor_parallel_size"]) == (1, 4)
    assert main(components["decode"])["resources"]["limits"]["nvidia.com/gpu"] == "4"
    # /dev/shm per pod: 2Gi per rank (the operator's default is 8Gi whatever the ranks), inside the memory limit
    assert (components["prefill"]["sharedMemorySize"], components["decode"]["sharedMemorySize"]) == ("2Gi", "8Gi")
    assert "Frontend" in components and "sharedMemorySize" not in components["Frontend"]


def test_frontend_args_parse_as_dynamos_frontend_reads_them() -> None:
    frontend_args_module = pytest.importorskip("dynamo.frontend.frontend_args")
    parser = argparse.ArgumentParser()
    frontend_args_module.FrontendArgGroup().add_arguments(parser)
    parsed, unknown = parser.parse_known_args(frontend_args())
    config = frontend_args_module.FrontendConfig.from_cli_args(parsed)
    config.validate()
    assert unknown == [] and (config.router_mode, config.migration_limit, config.http_port) == ("kv", 3, 8000)
    assert config.overlap_score_credit == 4.0


def test_multinode_disaggregated_graph(artifact, tmp_path, capsys):
    out = tmp_path / "dgd"
    dynamo(artifact(target="llmapi", tp=8, pp=1), out, capsys, "--disagg", "--gpus-per-node", "4",
           "--prefill-tp", "4", "--decode-tp", "8")
    assert check_dir(out) == (7, [])
    dgd, components, _ = graph(out)
    assert "multinode" not in components["prefill"]
    assert components["decode"]["multinode"] == {"nodeCount": 2}
    assert main(components["decode"])["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert dgd["spec"]["env"] == [{"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"},
                                  {"name": "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "value": "1"}]


def test_bad_requests_are_one_sentence(artifact, tmp_path, capsys):
    engine = artifact(target="engine", tp=1)
    assert run(["deploy", "dynamo", str(engine), "--out", str(tmp_path / "a"), "--image", IMAGE, "--pvc", "m"]) == 2
    assert "rebuild with --target llmapi" in capsys.readouterr().err
    llmapi = artifact(target="llmapi", tp=2)
    assert run(["deploy", "dynamo", str(llmapi), "--out", str(tmp_path / "b"), "--image", IMAGE, "--pvc", "m",
                "--disagg", "--decode-tp", "6", "--gpus-per-node", "4"]) == 2
    assert "multiple of --gpus-per-node" in capsys.readouterr().err


def test_deploy_check_catches_a_hand_edit(artifact, tmp_path, capsys):
    out = tmp_path / "dgd"
    dynamo(artifact(target="llmapi", tp=1), out, capsys, "--disagg")
    path = out / "dynamographdeployment.yaml"
    path.write_text(path.read_text().replace("type: decode", "type: decoder"))
    _, findings = check_dir(out)
    assert findings and "decoder" in findings[0].message


def test_each_role_scales_through_its_adapter(artifact, tmp_path, capsys):
    out = tmp_path / "dgd"
    dynamo(artifact(target="llmapi", tp=1), out, capsys, "--disagg", "--max-replicas", "6")
    _, components, _ = graph(out)
    assert all(components[role]["scalingAdapter"] == {} for role in ("prefill", "decode"))
    assert "scalingAdapter" not in components["Frontend"]
    written = yaml.safe_load_all((out / "scaledobjects.yaml").read_text())
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in written}
    assert set(scaled) == {"llama-3-1-70b-instruct-prefill", "llama-3-1-70b-instruct-decode"}
    prefill, decode = (scaled[f"llama-3-1-70b-instruct-{r}"] for r in ("prefill", "decode"))
    assert prefill["spec"]["scaleTargetRef"]["kind"] == "DynamoGraphDeploymentScalingAdapter"
    assert prefill["spec"]["maxReplicaCount"] == 6
    assert prefill["spec"]["triggers"][0]["metadata"]["query"] == \
        'sum(dynamo_frontend_queued_requests{namespace="default",app="llama-3-1-70b-instruct"})'
    assert decode["spec"]["triggers"][0]["metadata"]["threshold"] == "64"
    path = out / "scaledobjects.yaml"
    path.write_text(path.read_text().replace("instruct-decode\n", "instruct-decoder\n"))
    _, findings = check_dir(out)
    assert [f.path for f in findings] == ["spec/scaleTargetRef"]


def test_unscaled_graph_and_hpa_refused(artifact, tmp_path, capsys):
    out = tmp_path / "dgd"
    dynamo(artifact(target="llmapi", tp=1), out, capsys, "--autoscaler", "none")
    _, components, _ = graph(out)
    assert "scalingAdapter" not in components["TRTLLMWorker"] and not (out / "scaledobjects.yaml").exists()
    assert run(["deploy", "dynamo", str(artifact(target="llmapi", tp=1)), "--out", str(tmp_path / "h"), "--image",
                IMAGE, "--pvc", "m", "--autoscaler", "hpa"]) == 2
