"""What `deploy k8s` writes around the serving pods, and what `deploy check` refuses when it is edited: the
NetworkPolicy (the OpenAI and metrics ports from outside, everything inside a group), the dashboard as a ConfigMap
for Grafana's sidecar, the alert rules in the PrometheusRule. Prometheus evaluates them in test_prometheus.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from deploy_helpers import IMAGE

from trtllm_kit.cli import run
from trtllm_kit.deploy.render import check_dir


def written(artifact_dir: Path, out: Path, *args: str) -> dict[str, dict]:
    assert run(["deploy", "k8s", str(artifact_dir), "--out", str(out), "--pvc", "models", "--image", IMAGE,
                "--name", "llama", *args]) == 0
    found = {}
    for name in yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]:
        for doc in yaml.safe_load_all((out / name).read_text()):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def rewrite(out: Path, file: str, edit) -> None:
    doc = yaml.safe_load((out / file).read_text())
    edit(doc)
    (out / file).write_text(yaml.safe_dump(doc))


def test_one_node_policy_opens_the_api_and_metrics_only(artifact, tmp_path):
    found = written(artifact(tp=2), tmp_path / "k8s")
    policy = found["NetworkPolicy/llama"]["spec"]
    assert policy["policyTypes"] == ["Ingress"]  # egress open: the artifact fetch, DNS
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": "openai"},
                                            {"protocol": "TCP", "port": "metrics"}]}]
    pod = found["Deployment/llama"]["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports == {"http", "grpc", "metrics", "openai"}  # Triton's http and grpc stay closed from outside


def test_group_policy_lets_the_group_talk_and_selects_workers(artifact, tmp_path):
    found = written(artifact(tp=8), tmp_path / "k8s", "--gpus-per-node", "4")
    policy = found["NetworkPolicy/llama"]["spec"]
    assert policy["ingress"][1] == {"from": [{"podSelector": {"matchLabels": {"app": "llama"}}}]}
    group = found["LeaderWorkerSet/llama"]["spec"]["leaderWorkerTemplate"]
    for template in (group["leaderTemplate"], group["workerTemplate"]):  # ssh and NCCL between leader and workers
        assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_check_refuses_a_policy_that_closes_a_routed_port(artifact, tmp_path):
    out = tmp_path / "k8s"
    written(artifact(tp=2), out)
    rewrite(out, "networkpolicy.yaml", lambda d: d["spec"]["ingress"][0]["ports"].pop())
    _, findings = check_dir(out)
    assert [str(f) for f in findings] == [
        "service.yaml: Service llama-api at spec/ports: routes port 'metrics', which NetworkPolicy llama closes to "
        "clients; add it to the policy's ingress rule without 'from'"]
    rewrite(out, "networkpolicy.yaml",
            lambda d: d["spec"]["ingress"][0].update({"from": [{"podSelector": {"matchLabels": {"app": "llama"}}}]}))
    _, findings = check_dir(out)
    assert len(findings) == 2  # only the group may reach the API: clients cannot


def test_dashboard_is_a_configmap_for_grafanas_sidecar(artifact, tmp_path):
    out = tmp_path / "k8s"
    found = written(artifact(tp=2), out)
    config_map = found["ConfigMap/llama-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(config_map["data"]["trtllm-kit-llama.json"])
    assert board["uid"] == "trtllm-kit-llama" and len(board["panels"]) == 8
    assert not (out / "dashboard.json").exists()  # one copy: the ConfigMap's
    rewrite(out, "dashboard-configmap.yaml", lambda d: d["data"].update({"trtllm-kit-llama.json": "{\"panels\": "}))
    _, findings = check_dir(out)
    assert len(findings) == 1 and findings[0].path == "data/trtllm-kit-llama.json" and "not JSON" in str(findings[0])


def test_alerts_follow_the_queue_target_and_the_ttft_objective(artifact, tmp_path):
    found = written(artifact(tp=2), tmp_path / "k8s", "--queue-target", "3", "--ttft-slo", "1.5")
    _, alerting = found["PrometheusRule/llama"]["spec"]["groups"]
    assert alerting["name"] == "trtllm-kit-llama-alerts"
    rules = {r["alert"]: r for r in alerting["rules"]}
    assert list(rules) == ["TrtllmKitQueueBacklog", "TrtllmKitErrorRate", "TrtllmKitTimeToFirstToken",
                           "TrtllmKitKVCacheFull"]
    assert rules["TrtllmKitQueueBacklog"]["expr"] == ('sum by (namespace, app, pod) (nv_trt_llm_request_metrics'
                                                      '{namespace="default",app="llama",request_type="waiting"}) > 6')
    assert rules["TrtllmKitTimeToFirstToken"]["expr"].endswith(") > 1.5")
    assert 'status=~"5.."' in rules["TrtllmKitErrorRate"]["expr"]  # a refused key (401) is not a server error
    assert rules["TrtllmKitKVCacheFull"]["for"] == "5m"


@pytest.mark.parametrize("slo", ["0", "-1"])
def test_a_ttft_objective_must_be_positive(artifact, tmp_path, capsys, slo):
    code = run(["deploy", "k8s", str(artifact(tp=2)), "--out", str(tmp_path / "k8s"), "--pvc", "models", "--image",
                IMAGE, "--ttft-slo", slo])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"Error: --ttft-slo {float(slo)} must be a positive number of " \
        "seconds, e.g. 2."
