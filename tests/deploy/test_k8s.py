"""`trtllm-kit deploy k8s` and `deploy check`: the objects for one node and for tp 8 on two nodes of 4 GPUs, each
autoscaler, every object validated (core kinds by kubernetes-validate strict at 1.33, CRDs with unknown fields
rejected), and hand-broken objects caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trtllm_kit.cli import run
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.deploy.source import read_source
from trtllm_kit.deploy.validate import check_object

URL = "https://files.example/llama70b.tar"


def deploy(artifact: Path, out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = run(["deploy", "k8s", str(artifact), "--out", str(out), "--json", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def objects(out: Path) -> dict[str, dict]:
    found = {}
    for name in yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]:
        for doc in yaml.safe_load_all((out / name).read_text()):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def test_one_node_deployment(artifact, tmp_path, capsys):
    art = artifact(tp=2, pp=2)
    written = deploy(art, tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "8")
    assert written["num_nodes"] == 1 and "deployment.yaml" in written["resources"]
    assert check_dir(tmp_path / "k8s") == (7, [])
    found = objects(tmp_path / "k8s")
    pod = found["Deployment/llama-3-1-70b-instruct"]["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["command"][:3] == ["trtllm-kit", "serve", "/models/llama70b"]  # where config.pbtxt expects it
    assert {p["containerPort"] for p in server["ports"]} == {8000, 8001, 8002, 9000}  # in-pod: probes, frontend
    routed = found["Service/llama-3-1-70b-instruct"]["spec"]["ports"]
    assert {(p["port"], p["targetPort"]) for p in routed} == {(9000, "openai"), (8002, "metrics")}
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "4"
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/ready"
    # 17 GB per rank at 0.5 GB/s = 34 s, doubled + 60 s = 128 s → 130 s in 10 s periods
    assert (startup["periodSeconds"], startup["failureThreshold"]) == (10, 13)
    assert server["command"][server["command"].index("--ready-timeout") + 1] == "130"
    assert pod["terminationGracePeriodSeconds"] == 10 + 30 + 10  # drain + exit timeout + spare
    assert server["command"][server["command"].index("--exit-timeout") + 1] == "30"
    assert pod["securityContext"]["runAsNonRoot"] is True
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}  # 2Gi x 4 ranks
    fetch = pod["initContainers"][0]
    assert "sha256sum --check" in fetch["args"][0]
    sums = found["ConfigMap/llama-3-1-70b-instruct-sha256"]["data"]["SHA256SUMS"]
    assert sums.splitlines()[0] == f"{0:064x}  engines/rank0.engine" and len(sums.splitlines()) == 5
    assert found["ScaledObject/llama-3-1-70b-instruct"]["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert "replicas" not in found["Deployment/llama-3-1-70b-instruct"]["spec"]  # the autoscaler owns it
    assert found["PodDisruptionBudget/llama-3-1-70b-instruct"]["apiVersion"] == "policy/v1"


def test_tp8_on_two_nodes_of_four_gpus(artifact, tmp_path, capsys):
    art = artifact(tp=8)
    written = deploy(art, tmp_path / "k8s", capsys, "--artifact-url", URL, "--gpus-per-node", "4",
                     "--name", "llama70b", "--namespace", "llm")
    assert written["num_nodes"] == 2 and "leaderworkerset.yaml" in written["resources"]
    assert check_dir(tmp_path / "k8s") == (11, [])
    found = objects(tmp_path / "k8s")
    lws = found["LeaderWorkerSet/llama70b"]["spec"]
    group = lws["leaderWorkerTemplate"]
    assert group["size"] == 2 and lws["startupPolicy"] == "LeaderCreated"
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    assert leader["metadata"]["labels"]["role"] == "leader" and worker["metadata"]["labels"]["role"] == "worker"
    assert leader["spec"]["serviceAccountName"] == "llama70b-leader"
    for template in (leader, worker):
        assert template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "ports" not in worker["spec"]["containers"][0]  # only the leader serves
    mpirun = run_leader_script(found["ConfigMap/llama70b-launch"]["data"]["leader.sh"], tmp_path)
    assert mpirun[:4] == ["--host", "llama70b-0:4,llama70b-0-1:4", "--mca", "plm_rsh_agent"]
    ranks = " ".join(mpirun[5:]).split(" : ")
    assert len(ranks) == 8 and "--http-port=8000" in ranks[0] and "--allow-http=false" in ranks[7]
    restricted = next(a for a in ranks[0].split() if a.startswith("--http-restricted-api="))
    apis, _, token = restricted.partition("=")[2].partition(":trtllm-kit-token=")
    assert "model-repository" in apis.split(",") and len(token) == 48 and int(token, 16) >= 0  # drawn at start
    assert {p["targetPort"] for p in found["Service/llama70b"]["spec"]["ports"]} == {"openai", "metrics"}
    assert all("--exit-timeout-secs=30" in rank for rank in ranks)
    role = found["Role/llama70b-leader"]
    assert {"resources": ["pods/exec"], "verbs": ["create", "get"], "apiGroups": [""]} in role["rules"]
    for kind in ("Service", "PodMonitor"):
        spec = found[f"{kind}/llama70b"]["spec"]
        assert (spec.get("selector", {}).get("matchLabels") or spec["selector"]) == {"app": "llama70b",
                                                                                     "role": "leader"}
    scaled = found["ScaledObject/llama70b"]["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                        "name": "llama70b"}
    assert scaled["triggers"][0]["metadata"]["query"] == (
        'sum(nv_trt_llm_request_metrics{namespace="llm",app="llama70b",request_type="waiting"})')


def run_leader_script(script: str, tmp_path: Path) -> list[str]:
    """Run the leader's script with stand-ins for kubectl (the group's worker is Running) and mpirun (prints its
    argv); both act across pods, which this machine has none of."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text('#!/bin/sh\necho "$*" >> "$KUBECTL_LOG"\necho llama70b-0-1\n')
    (bin_dir / "mpirun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    for tool in ("kubectl", "mpirun"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "leader.sh").write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "POD_NAME": "llama70b-0", "POD_NAMESPACE": "llm",
           "GROUP_KEY": "abc123", "KUBECTL_LOG": str(tmp_path / "kubectl.log")}
    done = subprocess.run(["/bin/sh", str(tmp_path / "leader.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    asked = (tmp_path / "kubectl.log").read_text()
    assert "get pods -n llm -l leaderworkerset.sigs.k8s.io/group-key=abc123,role=worker" in asked
    return done.stdout.splitlines()


@pytest.mark.parametrize("autoscaler", ["keda", "hpa", "none"])
def test_each_autoscaler(artifact, tmp_path, capsys, autoscaler):
    art = artifact(tp=4)
    written = deploy(art, tmp_path / "k8s", capsys, "--pvc", "models", "--autoscaler", autoscaler,
                     "--min-replicas", "2", "--max-replicas", "6")
    assert check_dir(tmp_path / "k8s")[1] == []
    found = objects(tmp_path / "k8s")
    name = "llama-3-1-70b-instruct"
    if autoscaler == "hpa":
        hpa = found[f"HorizontalPodAutoscaler/{name}"]
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
        adapter = yaml.safe_load((tmp_path / "k8s" / "prometheus-adapter-values.yaml").read_text())
        assert adapter["rules"]["custom"][0]["name"]["as"] == hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    elif autoscaler == "keda":
        scaled = found[f"ScaledObject/{name}"]["spec"]
        assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (2, 6)
        assert scaled["triggers"][0]["metadata"]["threshold"] == "4"
    else:
        assert found[f"Deployment/{name}"]["spec"]["replicas"] == 2
        assert not any(k.startswith(("ScaledObject", "HorizontalPodAutoscaler")) for k in found)
    assert written["settings"]["autoscaler"] == autoscaler


def test_toml_table_and_flags(artifact, tmp_path, capsys):
    art = artifact(tp=8)
    config = tmp_path / "trtllm-kit.toml"
    config.write_text('[deploy]\ngpus-per-node = 4\npvc = "models"\nautoscaler = "hpa"\nqueue_target = 8\n')
    written = deploy(art, tmp_path / "k8s", capsys, "--config", str(config), "--autoscaler", "keda")
    assert written["num_nodes"] == 2 and written["settings"]["autoscaler"] == "keda"  # the flag wins
    assert written["settings"]["queue_target"] == 8


@pytest.mark.parametrize(("args", "message"), [
    ((), "give exactly one"),
    (("--pvc", "models", "--gpus-per-node", "3"), "do not fill nodes of 3 GPUs evenly"),
    (("--pvc", "Models"), "is not a Kubernetes name"),
    (("--pvc", "models", "--min-replicas", "5", "--max-replicas", "2"), "need 1 <= min <= max"),
])
def test_refusals(artifact, tmp_path, capsys, args, message):
    code = run(["deploy", "k8s", str(artifact(tp=8)), "--out", str(tmp_path / "k8s"), *args])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "k8s").exists()


def test_cpu_artifact_needs_no_gpu_and_one_pod(artifact, tmp_path, capsys):
    written = deploy(artifact(target="cpu", tp=2, pp=2), tmp_path / "k8s", capsys, "--pvc", "models",
                     "--gpus-per-node", "1")
    assert written["num_nodes"] == 1
    server = objects(tmp_path / "k8s")["Deployment/llama-3-1-70b-instruct"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in server["containers"][0]["resources"]["limits"] and "tolerations" not in server


def test_the_real_tiny_artifact_reads(tmp_path):
    from trtllm_kit.build.pipeline import run_build
    from trtllm_kit.spec import build_spec

    out = tmp_path / "out"
    run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out,
                              "build": {"verify": False, "until": "repo"}}))
    source = read_source(out)
    assert (source.target, source.world_size, source.mount_path) == ("cpu", 1, str(out.absolute()))
    assert source.load_bytes == sum((out / f.path).stat().st_size for f in source.files
                                    if f.path.startswith("checkpoint/"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert {f.path: f.sha256 for f in source.files} == manifest["outputs"]


BROKEN = [
    # (file, edit, expected message)
    ("deployment.yaml", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(bogus=1),
     "'bogus' was unexpected"),
    ("scaledobject.yaml", lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=4),
     "4 is not of type 'string'"),
    ("podmonitor.yaml", lambda d: d["spec"]["podMetricsEndpoints"][0].update(interval="5 seconds"),
     "does not match"),
    ("prometheusrule.yaml", lambda d: d["spec"].update(unknownField=True), "'unknownField' was unexpected"),
    ("deployment.yaml", lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=30),
     "does not cover the preStop drain"),
    ("service.yaml", lambda d: d["spec"]["selector"].update(role="worker"), "selects no serving pod"),
]


@pytest.mark.parametrize(("file", "edit", "message"), BROKEN)
def test_check_catches_a_broken_object(artifact, tmp_path, capsys, file, edit, message):
    deploy(artifact(tp=2), tmp_path / "k8s", capsys, "--pvc", "models")
    path = tmp_path / "k8s" / file
    doc = yaml.safe_load(path.read_text())
    edit(doc)
    path.write_text(yaml.safe_dump(doc))
    code = run(["deploy", "check", str(tmp_path / "k8s")])
    err = capsys.readouterr().err
    assert code == 1 and message in err, err


def test_check_rejects_the_removed_hpa_api(tmp_path):
    hpa = {"apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
           "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 2}}
    assert "Kubernetes 1.33 has no autoscaling/v2beta2" in str(check_object(hpa, "hpa.yaml")[0])


def test_crd_schemas_alone_accept_unknown_fields():
    """Why the kit closes the CRD schemas: the saved LeaderWorkerSet CRD does not refuse a misspelt field."""
    import jsonschema

    from trtllm_kit.deploy.validate import schema_dir

    crd = yaml.safe_load((schema_dir() / "leaderworkerset.x-k8s.io_leaderworkersets.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "x"},
           "spec": {"leaderWorkerTemplate": {"sise": 2, "workerTemplate": {"spec": {"containers": []}}}}}
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(lws))
    assert "'sise' was unexpected" in str(check_object(lws, "lws.yaml")[0])
