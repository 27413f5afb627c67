"""The llmapi target with LoRA: ``lora_config`` in the recorded options, adapters exported as PEFT directories, and
through a real tritonserver the ``lora_name`` input giving PeftModel's greedy tokens for each adapter and the base
in one batch, on the CPU ``LLM`` class (also for an adapter added while the server runs); deploy mounts and checks
the adapters."""

from __future__ import annotations

import copy
import queue
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from tests.integration.tritonserver import grpc_inputs, running_server
from tests.lora.adapters import make_adapter
from trtllm_kit.artifact import Artifact, LoraRecord
from trtllm_kit.artifact.integrity import artifact_changes
from trtllm_kit.cli import run
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.models.builtin import builtin_dir

grpcclient = pytest.importorskip("tritonclient.grpc")
MAX_TOKENS = 8
ADAPTERS = {"qv4": (4, 8, ["q_proj", "v_proj"]), "mlp16": (16, 32, ["o_proj", "gate_proj", "up_proj", "down_proj"])}
LORA_CONFIG = {"lora_target_modules": ["attn_q", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"],
               "max_lora_rank": 16, "max_loras": 2, "max_cpu_loras": 2}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("lora-llmapi")
    sources = {name: make_adapter(builtin_dir("tiny-llama"), root / name, rank=rank, targets=targets, alpha=alpha,
                                  seed=seed)
               for seed, (name, (rank, alpha, targets)) in enumerate(ADAPTERS.items())}
    out = root / "out"
    lora = [part for name, path in sources.items() for part in ("--lora", f"{name}={path}")]
    assert run(["build", "builtin:tiny-llama", "--target", "llmapi", "--dtype", "float32", "--no-verify",
                "--max-lora-rank", "16", "--max-loras", "2", *lora, "--out", str(out)]) == 0
    return out, sources


def test_lora_config_and_peft_directories_are_recorded(built: tuple[Path, dict[str, Path]]) -> None:
    out, sources = built
    artifact = Artifact.read(out)
    assert artifact.records.lora == LoraRecord(["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                               16, 2)
    assert yaml.safe_load((out / "repo/tensorrt_llm/1/model.yaml").read_text())["lora_config"] == LORA_CONFIG
    assert yaml.safe_load((out / "trtllm-serve/extra_llm_api_options.yaml").read_text())["lora_config"] == LORA_CONFIG
    for name, source in sources.items():
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            assert (out / "lora" / name / file).read_bytes() == (source / file).read_bytes()
    assert artifact_changes(artifact, hashes=True) == []
    config = parse_config((out / "repo/tensorrt_llm/config.pbtxt").read_text())
    [lora_name] = [i for i in config.input if i.name == "lora_name"]
    assert lora_name.optional and list(lora_name.dims) == [1]


def test_an_adapter_of_modules_the_build_left_out_is_refused(built: tuple[Path, dict[str, Path]], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = built
    k_only = make_adapter(builtin_dir("tiny-llama"), tmp_path / "k", rank=4, targets=["k_proj"], alpha=4, seed=9)
    assert run(["lora", "add", str(out), "k4", str(k_only)]) == 2
    err = capsys.readouterr().err
    assert "adapts k_proj" in err and "--lora-target-modules" in err
    assert "k4" not in Artifact.read(out).records.adapters


def _peft_tokens(sources: dict[str, Path], prompt: list[int]) -> dict[str | None, list[int]]:
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(builtin_dir("tiny-llama"), torch_dtype=torch.float32).eval()
    models: dict[str | None, torch.nn.Module] = {None: base}
    models.update({name: PeftModel.from_pretrained(copy.deepcopy(base), path).eval() for name, path in sources.items()})
    tokens = {}
    for name, model in models.items():
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=MAX_TOKENS,
                                 min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
        tokens[name] = out[0, len(prompt):].tolist()
    assert all(tokens[name] != tokens[None] for name in sources)  # every adapter changes the output
    return tokens


def _infer(url: str, prompt: list[int], lora_name: str | None) -> tuple[list[int] | None, str | None]:
    """(output tokens, None) or (None, the server's error) of one streamed request to the decoupled model."""
    inputs = {"input_ids": np.array(prompt, np.int32), "sampling_param_max_tokens": np.array([MAX_TOKENS], np.int32),
              "sampling_param_min_tokens": np.array([MAX_TOKENS], np.int32), "streaming": np.array([False])}
    if lora_name is not None:
        inputs["lora_name"] = np.array([lora_name], np.object_)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", grpc_inputs(inputs), enable_empty_final_response=True)
        tokens: list[int] = []
        for _ in range(MAX_TOKENS + 2):  # bounded: one response, or one per token, and the final one
            result, error = results.get(timeout=120)
            if error is not None:
                return None, str(error)
            response = result.get_response()
            if response.outputs:
                tokens += [int(t) for t in result.as_numpy("output_ids")]
            if response.parameters["triton_final_response"].bool_param:
                return tokens, None
        raise AssertionError("no final response")
    finally:
        client.stop_stream()
        client.close()


def test_lora_name_through_tritonserver_equals_peft(built: tuple[Path, dict[str, Path]],
                                                    tmp_path: Path) -> None:
    out, sources = built
    prompt = [1, 41, 55, 30, 48, 34, 9]
    want = _peft_tokens(sources, prompt)
    with running_server(out / "repo", tmp_path) as process:
        url = process.config.endpoints.url("grpc")
        names: list[str | None] = [None, *sources, *sources]  # base and each adapter twice, concurrently
        results: dict[int, tuple[list[int] | None, str | None]] = {}
        threads = [threading.Thread(target=lambda i=i, n=n: results.__setitem__(i, _infer(url, prompt, n)))
                   for i, n in enumerate(names)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert {i: results[i][0] for i in range(len(names))} == {i: want[n] for i, n in enumerate(names)}
        tokens, error = _infer(url, prompt, "missing")
        assert tokens is None and "LoRA adapter 'missing' is not in the artifact" in str(error)
        assert "it has: mlp16, qv4" in str(error)
        late = make_adapter(builtin_dir("tiny-llama"), tmp_path / "late", rank=8, targets=["q_proj", "down_proj"],
                            alpha=8, seed=5)  # added to the running server's artifact: no restart
        assert run(["lora", "add", str(out), "late", str(late)]) == 0
        try:
            assert _infer(url, prompt, "late") == (_peft_tokens({"late": late}, prompt)["late"], None)
        finally:
            assert run(["lora", "remove", str(out), "late"]) == 0
        assert "'late' is not in the artifact" in str(_infer(url, prompt, "late")[1])


def _sums(out: Path) -> str:
    for name in sorted(out.glob("*.yaml")):
        for doc in yaml.safe_load_all(name.read_text()):
            if doc and doc.get("kind") == "ConfigMap" and "SHA256SUMS" in doc.get("data", {}):
                return str(doc["data"]["SHA256SUMS"])
    raise AssertionError(f"no SHA256SUMS ConfigMap in {out}")


@pytest.mark.parametrize("kind", ["k8s", "dynamo"])
def test_deploy_mounts_and_checks_the_adapters(kind: str, built: tuple[Path, dict[str, Path]], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out, sources = built
    deployed = tmp_path / kind
    assert run(["deploy", kind, str(out), "--out", str(deployed), "--image", "nvcr.io/nvidia/tritonserver:25.10",
                "--pvc", "models"]) == 0, capsys.readouterr().err
    assert check_dir(deployed)[1] == []  # every object passes its schema
    sums = _sums(deployed)
    for name in sources:  # the adapters' files, with the sha256 of the PEFT weights they are
        record = Artifact.read(out).records.adapters[name]
        assert f"{record.sha256}  lora/{name}/adapter_model.safetensors\n" in sums
        assert f"  lora/{name}/adapter_config.json\n" in sums
    (tmp_path / "SHA256SUMS").write_text(sums)  # what the init container runs, in the mounted artifact
    check = subprocess.run(["sha256sum", "--check", "--quiet", "--strict", str(tmp_path / "SHA256SUMS")], cwd=out,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    if kind == "dynamo":
        [config] = yaml.safe_load_all((deployed / "engine-configmap.yaml").read_text())
        assert all(yaml.safe_load(text)["lora_config"] == LORA_CONFIG for text in config["data"].values())


def test_the_cpu_llm_refuses_what_lora_config_does_not_enable(built: tuple[Path, dict[str, Path]],
                                                              tmp_path: Path) -> None:
    from trtllm_kit.llmapi.cpu_llm import LLM, LoRARequest, SamplingParams

    out, sources = built
    args = {k: v for k, v in yaml.safe_load((out / "repo/tensorrt_llm/1/model.yaml").read_text()).items()
            if k != "triton_config"}
    k_only = make_adapter(builtin_dir("tiny-llama"), tmp_path / "k", rank=4, targets=["k_proj"], alpha=4, seed=9)
    with pytest.raises(ValueError, match=r"lora_path \(.*nowhere\) does not exist"):
        LoRARequest("x", 1, str(tmp_path / "nowhere"))
    llm = LLM(**args)
    try:
        with pytest.raises(ValueError, match="adapts k_proj, which lora_config's lora_target_modules does not enable"):
            llm.generate_async([1, 2, 3], SamplingParams(max_tokens=2), lora_request=LoRARequest("k", 7, str(k_only)))
    finally:
        llm.shutdown()
    plain = LLM(**{k: v for k, v in args.items() if k != "lora_config"})
    try:
        with pytest.raises(ValueError, match="a LoRA request needs lora_config in the LLM arguments"):
            plain.generate_async([1, 2, 3], SamplingParams(max_tokens=2),
                                 lora_request=LoRARequest("qv4", 3, str(sources["qv4"])))
    finally:
        plain.shutdown()
