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

from tests.deploy.conftest import write_artifact
from trtllm_kit.cli import run
from trtllm_kit.deploy.ray_app import IMPORT_PATH
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.deploy.validate import CRD_FILES, check_object, schema_dir

IMAGE = "registry.example/trtllm-kit:0.1.0-trtllm1.2.1"
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
    assert written["resources"] == ["kustomization.yaml", "sha256-configmap.yaml", "rayservice.yaml"]
    assert written["gpus_per_replica"] == 2
    doc = service(tmp_path / "ray")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    [app] = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == IMPORT_PATH and app["args"] == {"out": "/models/llama70b"}
    [model] = app["deployments"]
    assert model["name"] == "model"
    assert model["ray_actor_options"]["num_gpus"] == 2
    scaling = model["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["target_ongoing_requests"]) == (0, 3, 6)
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
    assert app["deployments"][0]["autoscaling_config"]["target_ongoing_requests"] == 4


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


def test_the_import_path_builds_the_model_deployment_of_serve_ray() -> None:
    pytest.importorskip("ray.serve")
    from trtllm_kit.deploy import ray_app
    from trtllm_kit.serve.ray.replica import Replica

    module, _, attribute = IMPORT_PATH.partition(":")
    assert module == ray_app.__name__
    application = getattr(ray_app, attribute)({"out": "/models/m"})
    deployment = application._bound_deployment
    assert deployment.name == "model" and deployment.func_or_class is Replica
    assert deployment.init_args == ("/models/m",)
