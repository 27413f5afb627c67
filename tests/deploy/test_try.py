"""`trtllm-kit deploy try`: the pods `deploy k8s` wrote, run here as the kubelet would (each pod in network and mount
namespaces of its own, only its volumes, probes as written), one OpenAI request through the clients' Service, a
clean stop; and the two first-apply defects (links into a claim the server does not mount, a Service named like the
LeaderWorkerSet) failing it with their cause."""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from deploy_helpers import IMAGE, TIMEOUT_S, deploy, link_the_claim, rewrite, tiny_copy
from kit_server import Builds

from trtllm_kit.cli import run
from trtllm_kit.deploy.source import read_source
from trtllm_kit.deploy.try_.cluster import read_cluster
from trtllm_kit.deploy.try_.try_directory import TryReport, try_directory

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                 reason="deploy try runs pods in namespaces of their own: root and unshare")]


@pytest.fixture(scope="module")
def tries(tiny: Path, kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TryReport]:
    """The generated Deployment of a cpu and an llmapi build (the artifact on a claim), each run once, both at the
    same time (each in a cluster network of its own): their probe periods and drains overlap."""
    outs = {"cpu": tiny, "llmapi": tiny_copy(kit_builds, tmp_path_factory.mktemp("tiny"), "llmapi")}
    dirs = {target: tmp_path_factory.mktemp("k8s") / "k8s" for target in outs}
    for target, out in outs.items():
        assert run(["deploy", "k8s", str(out), "--out", str(dirs[target]), "--pvc", "models",
                    "--image", IMAGE]) == 0
    with ThreadPoolExecutor(len(outs)) as pool:
        running = {target: pool.submit(try_directory, dirs[target], {"models": out}, timeout_s=TIMEOUT_S)
                   for target, out in outs.items()}
        return {target: future.result() for target, future in running.items()}


@pytest.fixture(params=["cpu", "llmapi"])
def served(request: pytest.FixtureRequest, tries: dict[str, TryReport]) -> TryReport:
    """The run of the cpu or the llmapi build's Deployment."""
    return tries[request.param]


def test_the_deployment_answers_through_its_service(served):
    assert served.failure is None
    assert served.service == "tiny-llama-api" and served.answer
    [pod] = served.pods
    assert pod.name == "tiny-llama-0" and pod.address.startswith("10.244.") and pod.ready_after_s is not None
    probes = {p.description.split()[0]: p for p in pod.probes}
    assert set(probes) == {"startupProbe", "readinessProbe", "livenessProbe"}
    assert all(p.passed_after_s is not None and p.last == "HTTP 200" for p in probes.values())
    assert probes["startupProbe"].description == "startupProbe GET :8000/v2/health/ready every 10 s, 60 failures"
    [stop] = pod.stopped
    # preStop sleeps the 10 s drain, then SIGTERM: tritonserver and the frontend end cleanly within the grace
    assert (stop.container, stop.exit_code, stop.killed) == ("server", 0, False)
    assert 10 <= stop.stopped_after_s < 50
    assert "replaced by this machine's environment" in served.image


def test_links_into_a_claim_the_server_does_not_mount_fail_with_their_cause(tiny, tmp_path, capsys):
    out = tmp_path / "k8s"
    deploy(tiny, out, capsys, "--pvc", "models")
    mount = read_source(tiny).mount_path  # where the server finds the artifact: the path its build recorded
    rewrite(out / "deployment.yaml", lambda doc: link_the_claim(doc["spec"]["template"]["spec"], mount))
    code = run(["deploy", "try", str(out), "--pvc-dir", f"models={tiny}", "--timeout", str(TIMEOUT_S)])
    err = capsys.readouterr().err
    assert code == 1
    assert re.search(rf"Error: deploy try failed: pod tiny-llama-0: container server reads \d+ links under {mount} "
                     r"that point into /pvc \(e\.g\. \S+ → /pvc/\./\S+\), which it does not mount, so every one "
                     "dangles", err), err


def test_a_service_named_like_the_leaderworkerset_leaves_the_group_unnamed(artifact, tmp_path, capsys):
    out = tmp_path / "k8s"
    deploy(artifact(tp=8), out, capsys, "--pvc", "models", "--gpus-per-node", "4", "--name", "llama")
    cluster = read_cluster(out)
    leader, worker = cluster.pods
    assert (leader.name, worker.name, cluster.notes) == ("llama-0", "llama-0-1", ())
    assert "llama-0-1.llama.default.svc" in cluster.hostnames(worker)  # the headless Service the controller made
    assert worker.injected_env["LWS_LEADER_ADDRESS"] == "llama-0.llama.default"

    rewrite(out / "service.yaml", lambda doc: doc["metadata"].update(name="llama"))
    cluster = read_cluster(out)
    assert cluster.hostnames(worker) == ["llama-0-1"]
    report = try_directory(out, {"models": tmp_path}, timeout_s=TIMEOUT_S)
    assert report.failure == ("Service llama has the LeaderWorkerSet's name, so its controller creates no headless "
                              "Service: the group's names <pod>.llama.default do not resolve, so the group cannot "
                              "start.")
    assert yaml.safe_load((out / "service.yaml").read_text())["metadata"]["name"] == "llama"
