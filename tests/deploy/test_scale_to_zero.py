"""`deploy k8s --min-replicas 0`: KEDA's HTTP add-on `HTTPScaledObject` in place of the queue's ScaledObject,
validated against the add-on's CRD shipped in the package (unknown fields refused), its hold checked against the
startup budget by `deploy check`; and run end to end by `deploy try`, whose interceptor holds the first request,
starts the replica and answers after its start-up."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import pytest
import yaml
from deploy_helpers import IMAGE, TIMEOUT_S, deploy, objects

from trtllm_kit.cli import run
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.deploy.try_.try_directory import try_directory
from trtllm_kit.deploy.validate import CRD_FILES, schema_dir

pytestmark = pytest.mark.slow

root_and_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                      reason="deploy try runs pods in namespaces of their own: root and unshare")


def test_zero_replicas_write_an_http_scaled_object(artifact, tmp_path, capsys):
    out = tmp_path / "k8s"
    written = deploy(artifact(tp=2), out, capsys, "--pvc", "models", "--min-replicas", "0", "--name", "llama",
                     "--namespace", "llm")
    assert "httpscaledobject.yaml" in written["resources"] and "scaledobject.yaml" not in written["resources"]
    found = objects(out)
    spec = found["HTTPScaledObject/llama"]["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama",
                                      "service": "llama-api", "port": 9000}
    assert spec["hosts"] == ["llama-api.llm.svc.cluster.local", "llama-api"]
    assert spec["replicas"] == {"min": 0, "max": 4}
    assert spec["scalingMetric"] == {"concurrency": {"targetValue": 64 + 4}}  # a full batch and the queue target
    assert spec["timeouts"]["conditionWait"] == f"{written['startup_budget_s']}s"  # a whole cold start is held
    assert "replicas" not in found["Deployment/llama"]["spec"]
    assert check_dir(out) == (9, [])  # in place of the ScaledObject


def test_a_group_scales_to_zero_by_its_leaderworkerset(artifact, tmp_path, capsys):
    out = tmp_path / "k8s"
    deploy(artifact(tp=8), out, capsys, "--pvc", "models", "--gpus-per-node", "4", "--min-replicas", "0",
           "--name", "llama")
    ref = objects(out)["HTTPScaledObject/llama"]["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llama")
    assert check_dir(out)[1] == []


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda s: s.update(bogus=1), r"spec: Additional properties are not allowed \('bogus' was unexpected\)"),
    (lambda s: s["replicas"].update(min="0"), r"spec/replicas/min: '0' is not of type 'integer'"),
    (lambda s: s.pop("scaleTargetRef"), r"spec: 'scaleTargetRef' is a required property"),
    (lambda s: s["timeouts"].update(conditionWait="20s"), r"spec/timeouts/conditionWait: holds the first request "
     r"20 s, not the startup budget of 600 s: it would fail while a replica starts; set it to 600s"),
])
def test_check_refuses_a_broken_http_scaled_object(artifact, tmp_path, capsys, edit, expected):
    out = tmp_path / "k8s"
    deploy(artifact(tp=2), out, capsys, "--pvc", "models", "--min-replicas", "0", "--name", "llama")
    doc = yaml.safe_load((out / "httpscaledobject.yaml").read_text())
    edit(doc["spec"])
    (out / "httpscaledobject.yaml").write_text(yaml.safe_dump(doc))
    _, findings = check_dir(out)
    assert any(re.search(expected, str(f)) for f in findings), [str(f) for f in findings]


@pytest.mark.parametrize("autoscaler", ["hpa", "none"])
def test_zero_replicas_need_keda(artifact, tmp_path, capsys, autoscaler):
    code = run(["deploy", "k8s", str(artifact(tp=2)), "--out", str(tmp_path / "k8s"), "--pvc", "models", "--image",
                "registry.example/trtllm-kit:0.1.0", "--min-replicas", "0", "--autoscaler", autoscaler])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "Error: --min-replicas 0 needs --autoscaler keda (KEDA's HTTP add-on holds the first request while a replica "
        f"starts), got --autoscaler {autoscaler}.")


def test_every_shipped_crd_is_recorded_with_its_hash():
    readme = (schema_dir() / "README.md").read_text()
    recorded = dict(reversed(line.split("  ")) for line in readme.splitlines() if re.match(r"^[0-9a-f]{64}  ", line))
    for name in CRD_FILES:
        assert recorded[name] == hashlib.sha256((schema_dir() / name).read_bytes()).hexdigest(), name
        source = rf"\| `{re.escape(name)}` \| ([^|]+ @ `[0-9a-f]{{40}}`[^|]*|same) \|"  # repository @ commit
        assert re.search(source, readme), name


@root_and_unshare
def test_deploy_try_holds_the_first_request_while_the_replica_starts(tiny, tmp_path):
    out = tmp_path / "k8s"
    assert run(["deploy", "k8s", str(tiny), "--out", str(out), "--pvc", "models", "--min-replicas", "0",
                "--image", IMAGE]) == 0
    report = try_directory(out, {"models": tiny}, timeout_s=TIMEOUT_S)
    assert report.failure is None and report.answer
    cold = report.cold_start
    assert cold is not None
    [pod] = report.pods
    # the replica was started by the request and became ready while the request was held
    assert pod.ready_after_s is not None and 0 < pod.ready_after_s <= cold.held_s + 1
    record = json.loads((out / "trtllm-kit-deploy.json").read_text())
    assert cold.budget_s == record["startup_budget_s"] == 600
    assert cold.predicted_s == record["startup"]["read_s"] + record["startup"]["fixed_s"] > 0
