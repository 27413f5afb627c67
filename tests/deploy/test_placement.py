"""GPU and runtime pinning: engines on the GPU product they were built for, FP8 checkpoints on compute capability
8.9 or newer (said in the pod template and held by `deploy check`), the image's TensorRT-LLM version checked
against the engines', and the Dockerfile agreeing with the kit's record of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from deploy_helpers import IMAGE, deploy, objects

from trtllm_kit.cli import run
from trtllm_kit.deploy.image import TRITON_CONTAINERS, VERSION_LABEL, base_image, image_trtllm_version

NAME = "llama-3-1-70b-instruct"
H100 = [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]
CHECKOUT = Path(__file__).resolve().parents[2]


def terms(template: dict) -> list[list[dict]]:
    node = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term["matchExpressions"] for term in node["nodeSelectorTerms"]]


def test_engines_run_on_their_build_gpu(artifact, tmp_path, capsys):
    deploy(artifact(tp=2), tmp_path / "one", capsys, "--pvc", "models")
    template = objects(tmp_path / "one")[f"Deployment/{NAME}"]["spec"]["template"]
    assert terms(template) == [H100]
    deploy(artifact(tp=8), tmp_path / "two", capsys, "--pvc", "models", "--gpus-per-node", "4",
           "--gpu-product", "NVIDIA H100 80GB HBM3")  # GPU Feature Discovery's spelling or the engine record's
    group = objects(tmp_path / "two")[f"LeaderWorkerSet/{NAME}"]["spec"]["leaderWorkerTemplate"]
    assert terms(group["leaderTemplate"]) == terms(group["workerTemplate"]) == [H100]


def test_an_engine_is_refused_on_another_gpu(artifact, tmp_path, capsys):
    code = run(["deploy", "k8s", str(artifact(tp=2)), "--out", str(tmp_path / "k8s"), "--pvc", "models",
                "--image", IMAGE, "--gpu-product", "NVIDIA-A100-SXM4-80GB"])
    err = capsys.readouterr().err
    assert code == 2 and "--gpu-product NVIDIA-A100-SXM4-80GB is not the GPU the engines were built for " \
                         "(NVIDIA H100 80GB HBM3, nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)" in err
    assert not (tmp_path / "k8s").exists()


def test_fp8_needs_compute_capability_8_9_said_and_checked(artifact, tmp_path, capsys):
    art = artifact(target="llmapi", tp=2, quant_algo="FP8")
    deploy(art, tmp_path / "k8s", capsys, "--pvc", "models")
    template = objects(tmp_path / "k8s")[f"Deployment/{NAME}"]["spec"]["template"]
    assert template["metadata"]["annotations"]["trtllm-kit.io/min-compute-capability"] == "8.9"
    assert terms(template) == [
        [{"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["8"]}],
        [{"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["8"]},
         {"key": "nvidia.com/gpu.compute.minor", "operator": "Gt", "values": ["8"]}]]
    path = tmp_path / "k8s" / "deployment.yaml"
    doc = yaml.safe_load(path.read_text())
    affinity = doc["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][1]["matchExpressions"].pop()
    path.write_text(yaml.safe_dump(doc))  # now 8.0 (A100) nodes would be admitted
    assert run(["deploy", "check", str(tmp_path / "k8s")]) == 1
    assert "trtllm-kit.io/min-compute-capability is 8.9 (an FP8 checkpoint), but a node selector term admits " \
           "GPUs of compute capability 8.0" in capsys.readouterr().err


def test_fp8_is_refused_on_a_gpu_without_it_and_unquantized_is_not_pinned(artifact, tmp_path, capsys):
    code = run(["deploy", "k8s", str(artifact(target="llmapi", tp=2, quant_algo="FP8")), "--out",
                str(tmp_path / "k8s"), "--pvc", "models", "--image", IMAGE, "--gpu-product", "NVIDIA-A100-SXM4-80GB"])
    assert code == 2 and "needs compute capability 8.9 or newer, but NVIDIA-A100-SXM4-80GB is 8.0" in \
        capsys.readouterr().err
    deploy(artifact(target="llmapi", tp=2), tmp_path / "plain", capsys, "--pvc", "models")
    spec = objects(tmp_path / "plain")[f"Deployment/{NAME}"]["spec"]["template"]["spec"]
    assert "affinity" not in spec


@pytest.mark.parametrize(("image", "given", "found"), [
    ("registry.example/trtllm-kit:0.1.0-trtllm1.2.1", None, "1.2.1"),
    ("registry.example:5000/team/trtllm-kit:0.1.0-trtllm1.2.0rc2", None, "1.2.0rc2"),
    ("registry.example:5000/trtllm-kit", None, None),
    ("registry.example/trtllm-kit:latest", "1.2.1", "1.2.1"),
])
def test_the_image_trtllm_version_from_its_tag_or_the_flag(image, given, found):
    assert image_trtllm_version(image, given) == found


@pytest.mark.parametrize(("args", "refused"), [
    (("--image", "registry.example/trtllm-kit:0.1.0-trtllm1.1.0"), "holds TensorRT-LLM 1.1.0, but the engines were "
                                                                    "built with 1.2.1"),
    (("--image", "registry.example/trtllm-kit:dev", "--image-trtllm-version", "1.3.0"), "holds TensorRT-LLM 1.3.0"),
    (("--image", "registry.example/trtllm-kit:dev"), None),  # the version is not given: nothing to compare
    ((), "--image is needed"),
])
def test_the_image_must_hold_the_engines_runtime(artifact, tmp_path, capsys, args, refused):
    code = run(["deploy", "k8s", str(artifact(tp=2)), "--out", str(tmp_path / "k8s"), "--pvc", "models", *args])
    err = capsys.readouterr().err
    if refused is None:
        assert code == 0, err
    else:
        assert code == 2 and refused in err, err


def test_the_dockerfile_builds_what_the_kit_records():
    text = (CHECKOUT / "docker" / "Dockerfile").read_text()
    release = re.search(r"^ARG TRITON_RELEASE=(\S+)$", text, re.M).group(1)
    version = re.search(r"^ARG TENSORRT_LLM_VERSION=(\S+)$", text, re.M).group(1)
    assert TRITON_CONTAINERS[version] == release
    base = re.search(r"^FROM (\S+)$", text, re.M).group(1).replace("${TRITON_RELEASE}", release)
    assert base == base_image(version) == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert f'LABEL {VERSION_LABEL}="${{TENSORRT_LLM_VERSION}}"' in text
    assert "COPY dist/trtllm_kit-" in text and "pip install --no-cache-dir /tmp/wheels/trtllm_kit-" in text
    assert "openssh-server" in text and "USER 1000" in text
