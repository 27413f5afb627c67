"""What a real cluster breaks on the first apply, each a defect `deploy check` passed before: the claim's links read
by every container, the LeaderWorkerSet's name left to its headless Service, groups placed without a zone label,
a queue series the image exports, the cluster's versions deciding what is written, sizes of files not on this disk,
and tolerations, Multus networks and IPC_LOCK on every serving pod."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deploy_artifacts import write_artifact
from deploy_helpers import IMAGE, deploy, link_the_claim, objects, rewrite

from trtllm_kit.cli import run
from trtllm_kit.deploy.render import check_dir

NAME = "llama-3-1-70b-instruct"
URL = "https://files.example/llama70b.tar"
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.3.1"
RANK_BYTES = 141_100_000_000 // 8  # Llama-3.1-70B bf16 in 8 ranks


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One of each kind, written once: engine tp 8 (one node of 8, or two of 4), llmapi tp 8, and a manifest whose
    rank files are neither on this disk nor sized in it."""
    root = tmp_path_factory.mktemp("artifacts")
    return {"engine": write_artifact(root / "engine", tp=8, rank_bytes=RANK_BYTES),
            "llmapi": write_artifact(root / "llmapi", target="llmapi", tp=8, rank_bytes=RANK_BYTES),
            "unsized": write_artifact(root / "unsized", tp=8, rank_bytes=RANK_BYTES, record_sizes=False)}


def pod_specs(found: dict[str, dict]) -> dict[str, dict]:
    """Every pod spec of a deploy directory, by where it is."""
    specs = {}
    for key, doc in found.items():
        if doc["kind"] == "Deployment":
            specs[key] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "LeaderWorkerSet":
            group = doc["spec"]["leaderWorkerTemplate"]
            specs[f"{key}/leader"] = group["leaderTemplate"]["spec"]
            specs[f"{key}/worker"] = group["workerTemplate"]["spec"]
        elif doc["kind"] == "DynamoGraphDeployment":
            for component in doc["spec"]["components"]:
                specs[f"{key}/{component['name']}"] = component["podTemplate"].get("spec") or {}
    return specs


def check_err(directory: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = run(["deploy", "check", str(directory), *args])
    return code, capsys.readouterr().err


# 1. --pvc: links into the claim dangle wherever the claim is not mounted (and serve refuses symlinked artifacts)


@pytest.mark.parametrize("layout", ["deployment", "leaderworkerset", "dynamo"])
def test_every_container_that_reads_the_artifact_mounts_the_claim_there(artifacts, tmp_path, capsys, layout):
    out = tmp_path / "k8s"
    if layout == "dynamo":
        code = run(["deploy", "dynamo", str(artifacts["llmapi"]), "--out", str(out), "--image", DYNAMO_IMAGE,
                    "--pvc", "models"])
        assert code == 0, capsys.readouterr().err
    else:
        deploy(artifacts["engine"], out, capsys, "--pvc", "models",
               "--gpus-per-node", "8" if layout == "deployment" else "4")
    checked = 0
    for where, spec in pod_specs(objects(out)).items():
        fetch = next((c for c in spec.get("initContainers") or [] if c["name"] == "fetch-artifact"), None)
        if fetch is None:
            continue  # the Dynamo frontend reads no artifact
        assert fetch["args"][0] == ("set -eu; cd /models/llama70b; sha256sum --check --quiet --strict "
                                    "/etc/trtllm-kit/SHA256SUMS")  # the files themselves: nothing is linked
        assert {v["name"]: v for v in spec["volumes"]}["pvc"]["persistentVolumeClaim"] == {
            "claimName": "models", "readOnly": True}
        for container in [fetch, *spec["containers"]]:
            if container["name"] in ("server", "main", "fetch-artifact"):
                assert {"name": "pvc", "mountPath": "/models/llama70b", "readOnly": True} in \
                    container["volumeMounts"], where
                checked += 1
    assert checked == {"deployment": 2, "leaderworkerset": 4, "dynamo": 2}[layout]
    assert check_dir(out)[1] == []


def test_check_refuses_links_a_container_cannot_follow(artifacts, tmp_path, capsys):
    """A directory of the old shape (the claim linked into an emptyDir the server reads, the claim mounted in the
    fetch container only), as an older kit wrote it or a hand edit makes it."""
    out = tmp_path / "k8s"
    deploy(artifacts["engine"], out, capsys, "--pvc", "models", "--gpus-per-node", "4")
    rewrite(out / "leaderworkerset.yaml", lambda doc: [
        link_the_claim(doc["spec"]["leaderWorkerTemplate"][t]["spec"], "/models/llama70b")
        for t in ("leaderTemplate", "workerTemplate")])
    code, err = check_err(out, capsys)
    assert code == 1
    assert ("containers/server/volumeMounts: reads what init container fetch-artifact linked into volume pvc at /pvc, "
            "but does not mount pvc there, so every link dangles") in err


# 2. the LeaderWorkerSet controller makes its headless Service only if no Service has the LeaderWorkerSet's name


def test_the_clients_service_leaves_the_leaderworkerset_name_free(artifacts, tmp_path, capsys):
    out = tmp_path / "k8s"
    written = deploy(artifacts["engine"], out, capsys, "--pvc", "models", "--gpus-per-node", "4")
    found = objects(out)
    assert f"LeaderWorkerSet/{NAME}" in found and f"Service/{NAME}" not in found
    assert found[f"Service/{NAME}-api"]["spec"]["selector"] == {"app": NAME, "role": "leader"}
    assert written["service"] == f"{NAME}-api"
    rewrite(out / "service.yaml", lambda doc: doc["metadata"].update(name=NAME))
    code, err = check_err(out, capsys)
    assert code == 1
    assert (f"Service {NAME} at metadata/name: has the LeaderWorkerSet's name, so the LeaderWorkerSet controller "
            "creates no headless Service and the workers' DNS names never resolve") in err


# 3. exclusive topology is a required affinity: nodes without the label hold no group, a domain one group


def test_groups_are_placed_freely_unless_a_topology_key_is_given(artifacts, tmp_path, capsys):
    deploy(artifacts["engine"], tmp_path / "free", capsys, "--pvc", "models", "--gpus-per-node", "4")
    lws = objects(tmp_path / "free")[f"LeaderWorkerSet/{NAME}"]
    assert "annotations" not in lws["metadata"]
    for template in ("leaderTemplate", "workerTemplate"):
        assert "podAffinity" not in (lws["spec"]["leaderWorkerTemplate"][template]["spec"].get("affinity") or {})
    deploy(artifacts["engine"], tmp_path / "rack", capsys, "--pvc", "models", "--gpus-per-node", "4",
           "--topology-key", "example.com/rack")
    lws = objects(tmp_path / "rack")[f"LeaderWorkerSet/{NAME}"]
    assert lws["metadata"]["annotations"] == {"leaderworkerset.sigs.k8s.io/exclusive-topology": "example.com/rack"}


# 4. the queue series must be one the image's trtllm-serve exports


@pytest.mark.parametrize(("version", "gauge"), [(None, False), ("1.2.1", False), ("1.3.0rc7", False),
                                                 ("1.3.0", True), ("1.4.1", True)])
def test_the_trtllm_serve_queue_is_one_the_image_exports(artifacts, tmp_path, capsys, version, gauge):
    image = f"registry.example/trtllm-kit:0.1.0-trtllm{version}" if version else "registry.example/trtllm-kit:x"
    deploy(artifacts["llmapi"], tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "4",
           "--image", image)
    found = objects(tmp_path / "k8s")
    query = found[f"ScaledObject/{NAME}"]["spec"]["triggers"][0]["metadata"]["query"]
    rules = [r["expr"] for r in found[f"PrometheusRule/{NAME}"]["spec"]["groups"][0]["rules"]]
    sel = f'namespace="default",app="{NAME}"'
    if gauge:
        assert query == f"sum(trtllm_num_requests_waiting{{{sel}}})"
        assert all("request_queue_time" not in expr for expr in rules)
    else:
        waiting = f'rate({{__name__=~"(trtllm_)?request_queue_time_seconds_sum",{sel}}}[1m])'
        assert query == f"sum({waiting}) or (0 * count(up{{{sel}}} == 1))"
        assert f"sum by (namespace, pod) ({waiting})" in rules
        assert all("trtllm_num_requests_waiting" not in text for text in [query, *rules])


# 5. the cluster's versions decide what is written, and deploy check refuses what they cannot run


def test_old_clusters_get_what_they_run(artifacts, tmp_path, capsys):
    deploy(artifacts["engine"], tmp_path / "old", capsys, "--pvc", "models", "--api-keys-secret", "keys",
           "--k8s-version", "1.28", "--keda-version", "2.16")
    found = objects(tmp_path / "old")
    spec = found[f"Deployment/{NAME}"]["spec"]["template"]["spec"]
    assert spec["containers"][0]["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "10"]}}
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-artifact"]
    assert [c["name"] for c in spec["containers"]] == ["server", "usage-log"]  # no native sidecars before 1.29
    assert "restartPolicy" not in spec["containers"][1]
    assert found[f"ScaledObject/{NAME}"]["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 1}
    record = json.loads((tmp_path / "old" / "trtllm-kit-deploy.json").read_text())
    assert (record["kubernetes"], record["keda"]) == ("1.28", "2.16")
    assert check_dir(tmp_path / "old")[1] == []  # checked against the versions it was written for

    deploy(artifacts["engine"], tmp_path / "new", capsys, "--pvc", "models", "--api-keys-secret", "keys")
    found = objects(tmp_path / "new")
    spec = found[f"Deployment/{NAME}"]["spec"]["template"]["spec"]
    assert spec["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}
    assert spec["initContainers"][1]["restartPolicy"] == "Always"
    assert found[f"ScaledObject/{NAME}"]["spec"]["fallback"]["behavior"] == "currentReplicasIfHigher"


@pytest.mark.parametrize(("args", "message"), [
    (("--k8s-version", "1.29"), "uses the preStop sleep action, which needs Kubernetes >= 1.30, but the cluster is "
                                "Kubernetes 1.29"),
    (("--k8s-version", "1.28"), "uses native sidecars (init containers with restartPolicy: Always), which needs "
                                "Kubernetes >= 1.29, but the cluster is Kubernetes 1.28"),
    (("--keda-version", "2.16"), "uses fallback.behavior, which needs KEDA >= 2.17, but the cluster is KEDA 2.16"),
])
def test_check_refuses_what_the_stated_versions_cannot_run(artifacts, tmp_path, capsys, args, message):
    deploy(artifacts["engine"], tmp_path / "k8s", capsys, "--pvc", "models", "--api-keys-secret", "keys")
    code, err = check_err(tmp_path / "k8s", capsys, *args)
    assert code == 1 and message in err, err


def test_a_version_outside_the_schemas_is_refused(artifacts, tmp_path, capsys):
    code = run(["deploy", "k8s", str(artifacts["engine"]), "--out", str(tmp_path / "k8s"), "--pvc", "models",
                "--image", IMAGE, "--k8s-version", "1.24"])
    assert code == 2
    assert "--k8s-version 1.24 is outside 1.25-1.37" in capsys.readouterr().err


# 6. sizes: a file not on this disk is sized from the manifest, or refused


def test_sizes_of_files_not_on_this_disk_come_from_the_manifest(artifacts, tmp_path, capsys):
    written = deploy(artifacts["llmapi"], tmp_path / "k8s", capsys, "--artifact-url", URL)
    assert written["startup_budget_s"] == 830  # 141 GB at 0.5 GB/s = 283 s + 540 s, not the 600 s floor
    spec = objects(tmp_path / "k8s")[f"Deployment/{NAME}"]["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "146Gi"  # 141.1 GB x 1.1, + 1 Gi


def test_files_neither_on_disk_nor_sized_are_refused(artifacts, tmp_path, capsys):
    code = run(["deploy", "k8s", str(artifacts["unsized"]), "--out", str(tmp_path / "k8s"), "--artifact-url", URL,
                "--image", IMAGE])
    assert code == 2
    assert (f"Error: 9 of 10 artifact files are not in {artifacts['unsized']} and the manifest records no size for "
            "them (the first: engines/rank0.engine)") in capsys.readouterr().err
    assert not (tmp_path / "k8s").exists()


# 7. tolerations, Multus networks and IPC_LOCK


def test_tolerations_networks_and_ipc_lock_reach_every_serving_pod(artifacts, tmp_path, capsys):
    out = tmp_path / "k8s"
    deploy(artifacts["engine"], out, capsys, "--pvc", "models", "--gpus-per-node", "4",
           "--toleration", "dedicated=llm:NoSchedule", "--toleration", "rdma", "--network", "rdma/ib-net@net1",
           "--network", "ib-net2", "--add-capability", "IPC_LOCK")
    assert check_dir(out)[1] == []
    lws = objects(out)[f"LeaderWorkerSet/{NAME}"]["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        template = lws[role]
        assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma/ib-net@net1,ib-net2"
        spec = template["spec"]
        assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"} in spec["tolerations"]
        assert {"key": "rdma", "operator": "Exists"} in spec["tolerations"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        server = spec["containers"][0]
        security = server["securityContext"]
        assert security["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert (security["runAsUser"], security["allowPrivilegeEscalation"]) == (0, False)
        assert {"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"} in server["env"]
        assert spec["securityContext"]["runAsNonRoot"] is True  # the fetch container stays uid 1000
        assert "runAsUser" not in spec["initContainers"][0]["securityContext"]


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--toleration", "dedicated=llm:Sometimes", "--toleration 'dedicated=llm:Sometimes' is not KEY[=VALUE][:EFFECT]"),
    ("--network", "Bad_Net", "--network 'Bad_Net' is not a NetworkAttachmentDefinition reference"),
    ("--add-capability", "SYS_ADMIN", "Invalid value for '--add-capability'"),
])
def test_malformed_additions_are_refused_in_one_sentence(artifacts, tmp_path, capsys, flag, value, message):
    code = run(["deploy", "k8s", str(artifacts["engine"]), "--out", str(tmp_path / "k8s"), "--pvc", "models",
                "--image", IMAGE, flag, value])
    assert code == 2 and message in capsys.readouterr().err
