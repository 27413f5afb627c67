"""`deploy k8s --router inference-extension`: an InferencePool over the serving pods and an HTTPRoute to it, both
validated against the upstream CRDs shipped in the package, and the endpoint picker's values (modelServerType and
the protocol's metrics per serving process). That the served model exports those metrics is checked against a real
scrape in test_prometheus.py."""

from __future__ import annotations

import pytest
import yaml
from deploy_helpers import IMAGE, deploy, objects

from trtllm_kit.cli import run
from trtllm_kit.deploy.render import check_dir


def test_pool_and_route_over_the_serving_pods(artifact, tmp_path, capsys):
    out = tmp_path / "k8s"
    written = deploy(artifact(tp=2), out, capsys, "--pvc", "models", "--router", "inference-extension",
                     "--name", "llama", "--gateway", "llm-gateway")
    assert {"inferencepool.yaml", "httproute.yaml"} <= set(written["resources"])
    found = objects(out)
    pool = found["InferencePool/llama"]["spec"]
    assert pool == {"selector": {"matchLabels": {"app": "llama", "role": "leader"}}, "targetPorts": [{"number": 9000}],
                    "endpointPickerRef": {"name": "llama-epp", "port": {"number": 9002}, "failureMode": "FailOpen"}}
    template = found["Deployment/llama"]["spec"]["template"]
    assert pool["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    route = found["HTTPRoute/llama"]["spec"]
    assert route["parentRefs"] == [{"name": "llm-gateway"}]
    assert route["rules"][0]["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                 "name": "llama"}]
    values = yaml.safe_load((out / "endpoint-picker-values.yaml").read_text())
    assert values["inferencePool"]["modelServerType"] == "triton-tensorrt-llm"
    assert values["inferenceExtension"]["metrics"]["TotalQueuedRequests"] == \
        'nv_trt_llm_request_metrics{request_type="waiting"}'
    assert (values["inferenceExtension"]["metricsPort"], values["inferenceExtension"]["metricsPath"]) == \
        (8002, "/metrics")
    assert check_dir(out) == (11, [])


def test_trtllm_serve_leaders_are_picked_on_their_gauges(artifact, tmp_path, capsys):
    out = tmp_path / "k8s"
    deploy(artifact(target="llmapi", tp=8), out, capsys, "--pvc", "models", "--gpus-per-node", "4", "--router",
           "inference-extension", "--image", "registry.example/trtllm-kit:0.1.0-trtllm1.3.0")
    values = yaml.safe_load((out / "endpoint-picker-values.yaml").read_text())
    assert values["inferencePool"]["modelServerType"] == "trtllm-serve"
    assert values["inferenceExtension"]["metrics"]["KVCacheUtilization"] == "trtllm_kv_cache_utilization"
    assert (values["inferenceExtension"]["metricsPort"], values["inferenceExtension"]["metricsPath"]) == \
        (9000, "/prometheus/metrics")
    assert check_dir(out)[1] == []


def test_trtllm_serve_without_gauges_is_refused(artifact, tmp_path, capsys):
    code = run(["deploy", "k8s", str(artifact(target="llmapi", tp=8)), "--out", str(tmp_path / "k8s"), "--pvc",
                "models", "--gpus-per-node", "4", "--router", "inference-extension", "--image",
                IMAGE])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "Error: --router inference-extension reads trtllm_num_requests_waiting, which the image's trtllm-serve "
        "(TensorRT-LLM before 1.3) does not export; use an image with TensorRT-LLM 1.3 or later, or --router "
        "kube-proxy.")


@pytest.mark.parametrize(("file", "edit", "expected"), [
    ("inferencepool.yaml", lambda s: s.update(targetPorts=[]), "spec/targetPorts: [] should be non-empty"),
    ("inferencepool.yaml", lambda s: s["endpointPickerRef"].update(failureMode="Open"),
     "spec/endpointPickerRef/failureMode: 'Open' is not one of ['FailOpen', 'FailClose']"),
    ("inferencepool.yaml", lambda s: s["selector"]["matchLabels"].update(role="worker"),
     "inferencepool.yaml: InferencePool llama at selector: {'app': 'llama', 'role': 'worker'} selects no serving pod"),
    ("httproute.yaml", lambda s: s["rules"][0]["backendRefs"][0].update(name="other"),
     "httproute.yaml: HTTPRoute llama at spec/rules/backendRefs: InferencePool other is not in this directory"),
    ("httproute.yaml", lambda s: s.update(hostnames="llm"), "spec/hostnames: 'llm' is not of type 'array'"),
])
def test_check_refuses_a_broken_pool_or_route(artifact, tmp_path, capsys, file, edit, expected):
    out = tmp_path / "k8s"
    deploy(artifact(tp=2), out, capsys, "--pvc", "models", "--router", "inference-extension", "--name", "llama")
    doc = yaml.safe_load((out / file).read_text())
    edit(doc["spec"])
    (out / file).write_text(yaml.safe_dump(doc))
    _, findings = check_dir(out)
    assert any(expected in str(f) for f in findings), [str(f) for f in findings]
