"""``deploy ray``: a KubeRay RayService validated against KubeRay's saved CRD; refusals in one sentence."""

from __future__ import annotations

import configparser
import copy
import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_artifacts import write_artifact
from deploy_helpers import IMAGE

from trtllm_kit.cli import run
from trtllm_kit.deploy import gateway
from trtllm_kit.deploy.pod import security
from trtllm_kit.deploy.ray_app import IMPORT_PATH
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.deploy.validate import CRD_FILES, check_object, schema_dir
from trtllm_kit.serve.ray.routing import PREFIX_ROUTER

CHECKOUT = Path(__file__).resolve().parents[2]


def deploy_ray(art: Path, out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = run(["deploy", "ray", str(art), "--out", str(out), "--image", IMAGE, "--json", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def refusal(art: Path, out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = run(["deploy", "ray", str(art), "--out", str(out), *args])
    err = capsys.readouterr().err.strip()
    assert code != 0 and not out.exists()
    return err


def service(out: Path) -> dict[str, Any]:
    [doc] = yaml.safe_load_all((out / "rayservice.yaml").read_text())
    return doc


def test_rayservice_serves_the_application_with_ray_serve_autoscaling(tmp_path, capsys) -> None:
    art = write_artifact(tmp_path / "art", target="llmapi", tp=2)
    written = deploy_ray(art, tmp_path / "ray", capsys, "--pvc", "models", "--replicas", "0:3",
                         "--target-ongoing", "6")
    assert written["resources"] == ["kustomization.yaml", "sha256-configmap.yaml", "rayservice.yaml", "service.yaml",
                                    "networkpolicy.yaml"]
    assert written["gpus_per_replica"] == 2
    doc = service(tmp_path / "ray")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    [app] = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == IMPORT_PATH
    assert app["args"] == {"out": "/models/llama70b", "name": "meta-llama/Llama-3.1-70B-Instruct", "port": 9000}
    [frontend, model] = app["deployments"]
    assert frontend["name"] == "frontend" and frontend["num_replicas"] == 1
    assert model["name"] == "model"
    assert model["ray_actor_options"]["num_gpus"] == 2
    scaling = model["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["target_ongoing_requests"]) == (0, 3, 6)
    assert model["request_router_config"] == {  # the prefix router, by the artifact's KV cache block
        "request_router_class": PREFIX_ROUTER, "request_router_kwargs": {"tokens_per_block": 32}}
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no replica on the head
    [group] = cluster["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (0, 3)
    [worker] = group["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "2"
    [fetch] = group["template"]["spec"]["initContainers"]
    assert "sha256sum --check" in fetch["args"][0]
    assert check_dir(tmp_path / "ray")[1] == []


def test_queue_target_defaults_to_deploy_k8s_and_the_url_is_fetched(tmp_path, capsys) -> None:
    art = write_artifact(tmp_path / "art", target="llmapi", tp=1)
    deploy_ray(art, tmp_path / "ray", capsys, "--artifact-url", "https://files.example/a.tar")
    group = service(tmp_path / "ray")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    [fetch] = group["template"]["spec"]["initContainers"]
    assert fetch["env"] == [{"name": "ARTIFACT_URL", "value": "https://files.example/a.tar"}]
    assert "tar -x" in fetch["args"][0]
    [app] = yaml.safe_load(service(tmp_path / "ray")["spec"]["serveConfigV2"])["applications"]
    [model] = [deployment for deployment in app["deployments"] if deployment["name"] == "model"]
    assert model["autoscaling_config"]["target_ongoing_requests"] == 4


def test_deploy_check_refuses_an_unknown_field_in_the_rayservice(tmp_path, capsys) -> None:
    art = write_artifact(tmp_path / "art", target="llmapi", tp=1)
    deploy_ray(art, tmp_path / "ray", capsys, "--pvc", "models")
    doc = service(tmp_path / "ray")
    bad = copy.deepcopy(doc)
    bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["gpus"] = 2
    assert any("gpus" in f.message for f in check_object(bad, "rayservice.yaml"))
    (tmp_path / "ray" / "rayservice.yaml").write_text(yaml.safe_dump(bad))
    code = run(["deploy", "check", str(tmp_path / "ray")])
    assert code != 0 and "gpus" in capsys.readouterr().err


@pytest.mark.parametrize(("artifact", "args", "words"), [
    ({"target": "llmapi", "tp": 1}, ("--image", "rayproject/ray:2.60.0-py310-cpu"), ("CPU-only", "--image")),
    ({"target": "llmapi", "tp": 1}, ("--image", IMAGE, "--replicas", "3:1"), ("--replicas", "3:1")),
    ({"target": "engine", "tp": 1}, ("--image", IMAGE), ("target is engine", "--target llmapi")),
    ({"target": "llmapi", "tp": 8}, ("--image", IMAGE, "--gpus-per-node", "4"), ("8 GPUs", "--gpus-per-node")),
])
def test_refusals_are_one_sentence(tmp_path, capsys, artifact, args, words) -> None:
    art = write_artifact(tmp_path / "art", **artifact)
    err = refusal(art, tmp_path / "ray", capsys, "--pvc", "models", *args)
    assert all(word in err for word in words), err
    assert err.count(". ") == 0 and "\n" not in err


def test_the_package_ships_the_kuberay_crd() -> None:
    assert "ray.io_rayservices.yaml" in CRD_FILES
    assert (schema_dir() / "ray.io_rayservices.yaml").is_file()
    config = configparser.ConfigParser()
    config.read(CHECKOUT / "setup.cfg")
    patterns = config["options.package_data"]["trtllm_kit"].replace(",", " ").split()
    assert any(fnmatch.fnmatch("deploy/schemas/ray.io_rayservices.yaml", p) for p in patterns)


def test_the_import_path_builds_the_frontend_in_front_of_the_model_deployment_of_serve_ray() -> None:
    pytest.importorskip("ray.serve")
    from trtllm_kit.deploy import ray_app
    from trtllm_kit.serve.ray.ingress import Ingress
    from trtllm_kit.serve.ray.replica import Replica

    module, _, attribute = IMPORT_PATH.partition(":")
    assert module == ray_app.__name__
    application = getattr(ray_app, attribute)({"out": "/models/m", "name": "tiny", "port": "9000"})
    frontend = application._bound_deployment
    assert frontend.name == "frontend" and frontend.func_or_class is Ingress
    model_app, *args = frontend.init_args
    assert args == ["/models/m", "tiny", 9000, None, None]  # no gateway without its files
    deployment = model_app._bound_deployment
    assert deployment.name == "model" and deployment.func_or_class is Replica
    assert deployment.init_args == ("/models/m",)


def _docs(out: Path, name: str) -> dict[str, Any]:
    [doc] = yaml.safe_load_all((out / name).read_text())
    return doc


def test_the_frontend_is_the_http_entry_on_the_head_behind_a_service_and_a_network_policy(tmp_path, capsys) -> None:
    art = write_artifact(tmp_path / "art", target="llmapi", tp=1)
    deploy_ray(art, tmp_path / "ray", capsys, "--pvc", "models")  # the frontend on deploy's OpenAI port, 9000
    cluster = service(tmp_path / "ray")["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["resources"] == {"kit_frontend": "1"}  # only the head offers the frontend's resource
    [app] = yaml.safe_load(service(tmp_path / "ray")["spec"]["serveConfigV2"])["applications"]
    assert app["deployments"][0]["ray_actor_options"]["resources"] == {"kit_frontend": 1}
    assert app["route_prefix"] is None  # Ray's proxy routes nothing: the frontend is the entry
    [container] = head["template"]["spec"]["containers"]
    assert {"name": "openai", "containerPort": 9000} in container["ports"]
    api = _docs(tmp_path / "ray", "service.yaml")
    assert api["spec"]["selector"] == {"app": "llama-3-1-70b-instruct", "ray.io/node-type": "head"}
    assert api["spec"]["ports"] == [{"name": "openai", "port": 9000, "targetPort": "openai"}]
    policy = _docs(tmp_path / "ray", "networkpolicy.yaml")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app": "llama-3-1-70b-instruct"}}
    assert policy["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 9000}]},
        {"from": [{"podSelector": {"matchLabels": {"app": "llama-3-1-70b-instruct"}}}]},
        {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "kuberay-operator"}}}],
         "ports": [{"protocol": "TCP", "port": 8265}, {"protocol": "TCP", "port": 8000}]}]
    assert check_dir(tmp_path / "ray")[1] == []


def test_every_pod_and_container_runs_as_deploy_k8s_writes_them(tmp_path, capsys) -> None:
    art = write_artifact(tmp_path / "art", target="llmapi", tp=1)
    deploy_ray(art, tmp_path / "ray", capsys, "--pvc", "models")
    cluster = service(tmp_path / "ray")["spec"]["rayClusterConfig"]
    pod_security, container_security = security()
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        spec = template["spec"]
        assert spec["securityContext"] == pod_security
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            assert container["securityContext"] == container_security, container["name"]


def test_the_gateway_holds_in_front_of_the_cluster_frontend_with_a_key_secret(tmp_path, capsys) -> None:
    art = write_artifact(tmp_path / "art", target="llmapi", tp=1)
    deploy_ray(art, tmp_path / "ray", capsys, "--pvc", "models", "--api-keys-secret", "keys")
    doc = service(tmp_path / "ray")
    [app] = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["api_keys"] == gateway.KEYS_PATH and app["args"]["usage_log"] == gateway.USAGE_LOG
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "api-keys", "secret": {"secretName": "keys", "defaultMode": 0o440,
                                           "items": [{"key": "keys.json", "path": "keys.json"}]}} in head["volumes"]
    [container] = head["containers"]
    assert {"name": "api-keys", "mountPath": gateway.KEYS_DIR, "readOnly": True} in container["volumeMounts"]
    [sidecar] = head["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["command"][-1] == gateway.USAGE_LOG
    assert check_dir(tmp_path / "ray")[1] == []
    deploy_ray(art, tmp_path / "open", capsys, "--pvc", "models")  # without a Secret: no gateway
    [app] = yaml.safe_load(service(tmp_path / "open")["spec"]["serveConfigV2"])["applications"]
    assert "api_keys" not in app["args"]


def test_ray_serve_reads_the_serve_config_as_written(tmp_path, capsys) -> None:
    schema = pytest.importorskip("ray.serve.schema")
    art = write_artifact(tmp_path / "art", target="llmapi", tp=1)
    deploy_ray(art, tmp_path / "ray", capsys, "--pvc", "models", "--api-keys-secret", "keys")
    config = schema.ServeDeploySchema.model_validate(yaml.safe_load(service(tmp_path / "ray")["spec"]["serveConfigV2"]))
    [app] = config.applications
    assert app.route_prefix is None
    assert [d.name for d in app.deployments] == ["frontend", "model"]
    assert app.deployments[1].request_router_config["request_router_class"] == PREFIX_ROUTER
