"""`trtllm-kit deploy k8s` and `deploy check`: the objects for one node and for tp 8 on two nodes of 4 GPUs, each
autoscaler, every object validated (core kinds by kubernetes-validate strict at 1.33, CRDs with unknown fields
rejected), and hand-broken objects caught."""

from __future__ import annotations

import json

import pytest
import yaml
from deploy_helpers import IMAGE, deploy, objects

from trtllm_kit.cli import run
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.deploy.source import read_source
from trtllm_kit.deploy.validate import CRD_FILES, SCHEMAS_ENV, YAML_LOADER, check_object, schema_dir

URL = "https://files.example/llama70b.tar"


def test_one_node_deployment(artifact, tmp_path, capsys):
    art = artifact(tp=2, pp=2)
    written = deploy(art, tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "8")
    assert written["num_nodes"] == 1 and "deployment.yaml" in written["resources"]
    assert check_dir(tmp_path / "k8s") == (9, [])  # with the NetworkPolicy and the dashboard ConfigMap
    found = objects(tmp_path / "k8s")
    pod = found["Deployment/llama-3-1-70b-instruct"]["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["command"][:3] == ["trtllm-kit", "serve", "/models/llama70b"]  # where config.pbtxt expects it
    assert {p["containerPort"] for p in server["ports"]} == {8000, 8001, 8002, 9000}  # in-pod: probes, frontend
    routed = found["Service/llama-3-1-70b-instruct-api"]["spec"]["ports"]
    assert {(p["port"], p["targetPort"]) for p in routed} == {(9000, "openai"), (8002, "metrics")}
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "4"
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/ready"
    # 4 ranks x 17 GB from one claim at 0.5 GB/s = 136 s, + 180 s for the engine runtime: under the 10-minute floor
    assert (startup["periodSeconds"], startup["failureThreshold"]) == (10, 60)
    assert server["command"][server["command"].index("--ready-timeout") + 1] == "600"
    template = found["Deployment/llama-3-1-70b-instruct"]["spec"]["template"]
    assert template["metadata"]["annotations"]["trtllm-kit.io/startup-budget-s"] == "600"
    assert pod["terminationGracePeriodSeconds"] == 10 + 30 + 10  # drain + exit timeout + spare
    assert server["command"][server["command"].index("--exit-timeout") + 1] == "30"
    assert pod["securityContext"]["runAsNonRoot"] is True
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}  # 2Gi x 4 ranks
    fetch = pod["initContainers"][0]
    assert "sha256sum --check" in fetch["args"][0]
    sums = found["ConfigMap/llama-3-1-70b-instruct-sha256"]["data"]["SHA256SUMS"]
    assert sums.splitlines()[0] == f"{0:064x}  engines/rank0.engine" and len(sums.splitlines()) == 6
    assert found["ScaledObject/llama-3-1-70b-instruct"]["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert "replicas" not in found["Deployment/llama-3-1-70b-instruct"]["spec"]  # the autoscaler owns it
    assert found["PodDisruptionBudget/llama-3-1-70b-instruct"]["apiVersion"] == "policy/v1"


def test_tp8_on_two_nodes_of_four_gpus(artifact, tmp_path, capsys):
    art = artifact(tp=8)
    written = deploy(art, tmp_path / "k8s", capsys, "--artifact-url", URL, "--gpus-per-node", "4",
                     "--name", "llama70b", "--namespace", "llm", "--rdma-resource", "rdma/ib=1",
                     "--nccl-env", "NCCL_IB_HCA=mlx5", "--topology-key", "example.com/nvlink-domain")
    assert written["num_nodes"] == 2 and "leaderworkerset.yaml" in written["resources"]
    assert check_dir(tmp_path / "k8s") == (10, [])
    found = objects(tmp_path / "k8s")
    lws = found["LeaderWorkerSet/llama70b"]
    assert lws["metadata"]["annotations"] == {"leaderworkerset.sigs.k8s.io/exclusive-topology":
                                              "example.com/nvlink-domain"}
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and lws["spec"]["startupPolicy"] == "LeaderCreated"
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    assert leader["metadata"]["labels"]["role"] == "leader" and worker["metadata"]["labels"]["role"] == "worker"
    for template in (leader, worker):
        spec = template["spec"]
        container = spec["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert container["resources"]["limits"]["rdma/ib"] == "1" == container["resources"]["requests"]["rdma/ib"]
        assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in container["env"]
        assert "topologySpreadConstraints" not in spec and spec["automountServiceAccountToken"] is False
        assert {"name": "ssh", "secret": {"secretName": "llama70b-ssh", "defaultMode": 0o440}} in spec["volumes"]
    assert leader["spec"]["containers"][0]["command"] == ["trtllm-kit", "deploy", "leader",
                                                          "/opt/trtllm-kit/plan.json"]
    assert worker["spec"]["containers"][0]["command"] == ["/bin/sh", "/opt/trtllm-kit/worker.sh"]
    assert worker["spec"]["containers"][0]["ports"] == [{"name": "ssh", "containerPort": 2222}]
    assert not any(k.startswith(("Role", "ServiceAccount")) for k in found)  # nothing talks to the API
    kustomization = yaml.safe_load((tmp_path / "k8s" / "kustomization.yaml").read_text())
    assert kustomization["secretGenerator"][0]["name"] == "llama70b-ssh"
    key = tmp_path / "k8s" / "ssh" / "id_ed25519"
    assert key.stat().st_mode & 0o777 == 0o600 and "OPENSSH PRIVATE KEY" in key.read_text()
    assert (tmp_path / "k8s" / "ssh" / "id_ed25519.pub").read_text().startswith("ssh-ed25519 ")
    assert {p["targetPort"] for p in found["Service/llama70b-api"]["spec"]["ports"]} == {"openai", "metrics"}
    for key in ("Service/llama70b-api", "PodMonitor/llama70b"):
        spec = found[key]["spec"]
        assert (spec.get("selector", {}).get("matchLabels") or spec["selector"]) == {"app": "llama70b",
                                                                                     "role": "leader"}
    scaled = found["ScaledObject/llama70b"]["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                        "name": "llama70b"}
    assert scaled["triggers"][0]["metadata"]["query"] == (
        'sum(nv_trt_llm_request_metrics{namespace="llm",app="llama70b",request_type="waiting"})')


def test_a_given_ssh_secret_is_used_and_no_key_is_written(artifact, tmp_path, capsys):
    deploy(artifact(tp=8), tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "4",
           "--ssh-secret", "group-keys", "--topology-key", "")
    lws = objects(tmp_path / "k8s")["LeaderWorkerSet/llama-3-1-70b-instruct"]
    assert "annotations" not in lws["metadata"]
    assert not (tmp_path / "k8s" / "ssh").exists()
    assert "secretGenerator" not in yaml.safe_load((tmp_path / "k8s" / "kustomization.yaml").read_text())
    volumes = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["volumes"]
    assert {"name": "ssh", "secret": {"secretName": "group-keys", "defaultMode": 0o440}} in volumes


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
        assert scaled["triggers"][0]["metadata"]["ignoreNullValues"] == "false"  # a missing series is no 0
        assert scaled["fallback"] == {"failureThreshold": 3, "behavior": "currentReplicasIfHigher", "replicas": 2}
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
    (("--pvc", "models", "--min-replicas", "5", "--max-replicas", "2"), "need 0 <= min <= max and max >= 1"),
    (("--pvc", "models", "--rdma-resource", "rdma/ib"), "is not K=V"),
    (("--pvc", "models", "--nccl-env", "nccl_ib_hca=x"), "is not an environment variable"),
])
def test_refusals(artifact, tmp_path, capsys, args, message):
    code = run(["deploy", "k8s", str(artifact(tp=8)), "--out", str(tmp_path / "k8s"), "--image", IMAGE, *args])
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
    ("scaledobject.yaml", lambda d: d["spec"]["triggers"][0]["metadata"].update(ignoreNullValues="true"),
     "would read as 0 and scale down"),
    ("scaledobject.yaml", lambda d: d["spec"].pop("fallback"), "without a fallback a failing query"),
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

    crd = yaml.load((schema_dir() / "leaderworkerset.x-k8s.io_leaderworkersets.yaml").read_text(), YAML_LOADER)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "x"},
           "spec": {"leaderWorkerTemplate": {"sise": 2, "workerTemplate": {"spec": {"containers": []}}}}}
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(lws))
    assert "'sise' was unexpected" in str(check_object(lws, "lws.yaml")[0])


def test_check_reads_the_schemas_of_the_groups_it_meets_alone(artifact, tmp_path, capsys, monkeypatch):
    """A Deployment's directory is checked with KEDA's and Prometheus' CRDs alone: the megabytes of the
    LeaderWorkerSet, Dynamo and RayService schemas are not read (here: not there)."""
    out = tmp_path / "k8s"
    deploy(artifact(tp=2), out, capsys, "--pvc", "models")
    saved = tmp_path / "schemas"
    saved.mkdir()
    for name in CRD_FILES:
        if name.startswith(("keda.sh_", "monitoring.coreos.com_")):
            (saved / name).write_bytes((schema_dir() / name).read_bytes())
    monkeypatch.setenv(SCHEMAS_ENV, str(saved))
    assert check_dir(out) == (9, [])
    doc = yaml.safe_load((out / "podmonitor.yaml").read_text())
    doc["spec"]["bogus"] = True  # the schemas read still refuse unknown fields
    (out / "podmonitor.yaml").write_text(yaml.safe_dump(doc))
    assert any("'bogus' was unexpected" in str(f) for f in check_dir(out)[1])


def test_monitors_carry_the_labels_prometheus_selects(artifact, tmp_path, capsys):
    deploy(artifact(tp=2), tmp_path / "default", capsys, "--pvc", "models")
    found = objects(tmp_path / "default")
    for kind in ("PodMonitor", "PrometheusRule"):
        assert found[f"{kind}/llama-3-1-70b-instruct"]["metadata"]["labels"]["release"] == "prometheus"
    deploy(artifact(tp=2), tmp_path / "given", capsys, "--pvc", "models", "--monitor-labels", "release=kps",
           "--monitor-labels", "team=llm", "--fallback-replicas", "3", "--max-replicas", "5")
    found = objects(tmp_path / "given")
    for kind in ("PodMonitor", "PrometheusRule"):
        labels = found[f"{kind}/llama-3-1-70b-instruct"]["metadata"]["labels"]
        assert (labels["release"], labels["team"], labels["app"]) == ("kps", "llm", "llama-3-1-70b-instruct")
    assert found["ScaledObject/llama-3-1-70b-instruct"]["spec"]["fallback"]["replicas"] == 3
