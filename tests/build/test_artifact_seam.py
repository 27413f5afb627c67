"""The target seam end to end: a real build (trtllm-build faked, the one tool that cannot run here) → the typed
artifact read back → the validated repository → the serve launcher's exact per-rank argv. No hand-made manifests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fakes import FakeTrtllmBuild, h100_machine

from trtllm_kit.artifact import Artifact, ManifestError, upgrade_manifest
from trtllm_kit.artifact.files import sha256_file
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU, MIB
from trtllm_kit.model_repo.validate import validate_repository
from trtllm_kit.serve.options import Endpoints
from trtllm_kit.serve.servable import servable
from trtllm_kit.serve.server.launcher import LaunchConfig, launch_argv
from trtllm_kit.serve.server.locate import TritonInstall
from trtllm_kit.targets import limits_from_dir

DATA = Path(__file__).parents[1] / "data" / "manifests"
OPT = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), "/opt/tritonserver",
                    backend_dir=Path("/opt/tritonserver/backends"))


@pytest.fixture
def four_gpu_host(monkeypatch: pytest.MonkeyPatch) -> Machine:
    machine = h100_machine(num_gpus=4)
    monkeypatch.setattr("trtllm_kit.build.pipeline.detect_machine", lambda: machine)
    return machine


@pytest.fixture
def engine_out(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild, four_gpu_host: Machine) -> Path:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--tp", "2", "--pp", "2", "--no-verify", "--max-batch-size", "8",
                "--max-seq-len", "128", "--out", str(out)]) == 0
    assert len(fake_trtllm_build.calls) == 1
    return out


def rank_argv(repo: Path, rank: int) -> list[str]:
    argv = ["/opt/tritonserver/bin/tritonserver", f"--model-repository={repo}", "--disable-auto-complete-config",
            "--backend-directory=/opt/tritonserver/backends"]
    if rank == 0:
        argv += ["--http-address=127.0.0.1", "--http-port=8000", "--grpc-address=127.0.0.1", "--grpc-port=8001",
                 "--metrics-address=127.0.0.1", "--metrics-port=8002", "--strict-readiness=true", "--log-verbose=0"]
    else:
        argv += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
                 "--model-control-mode=explicit", "--load-model=tensorrt_llm"]
    return [*argv, "--exit-on-error=true", "--exit-timeout-secs=5",
            f"--backend-config=python,shm-region-prefix-name=trtllmkit_42_{rank}_",
            "--backend-config=python,shm-default-byte-size=4194304",
            "--backend-config=python,shm-growth-byte-size=1048576", "--backend-config=python,thread-pool-size=256"]


def test_build_to_launch_argv_at_tp2_pp2(engine_out: Path, four_gpu_host: Machine) -> None:
    artifact = Artifact.read(engine_out)
    assert (artifact.target, artifact.layout.tp_size, artifact.layout.pp_size, artifact.layout.world_size) == (
        "engine", 2, 2, 4)
    assert (artifact.precision.dtype, artifact.precision.quant_algo) == ("bfloat16", None)
    assert artifact.records.engine is not None and artifact.records.engine.built is not None
    assert artifact.records.engine.built.gpu == "NVIDIA H100 80GB HBM3"
    assert artifact.records.repo is not None and artifact.records.repo.target == "engine"
    assert sorted(artifact.files) == sorted(str(p.relative_to(engine_out)) for p in engine_out.rglob("*")
                                            if p.is_file() and p.name != "manifest.json")
    assert all(sha256_file(engine_out / name) == digest for name, digest in artifact.files.items())
    # what is written is what is read: the typed artifact reproduces the file exactly
    assert artifact.to_dict() == json.loads((engine_out / "manifest.json").read_text())

    assert validate_repository(engine_out / "repo", read_limits=limits_from_dir).errors == []

    served = servable(engine_out, four_gpu_host)
    assert (served.target.name, served.world_size, served.models) == ("engine", 4, ("tensorrt_llm_bls", "ensemble"))
    repo = served.repo.absolute()
    config = LaunchConfig(repo=repo, endpoints=Endpoints(), world_size=served.world_size, shm_prefix="trtllmkit_42_")
    expected = ["mpirun", "-n", "1", *rank_argv(repo, 0)]
    for rank in (1, 2, 3):
        expected += [":", "-n", "1", *rank_argv(repo, rank)]
    assert launch_argv(OPT, config, is_root=False) == expected


A100 = GPU("NVIDIA A100-SXM4-80GB", 81920 * MIB, (8, 0), "nvml")


@pytest.mark.parametrize(("machine", "problem"), [
    (h100_machine(num_gpus=4, tensorrt_llm="1.1.0"),
     "the engines were built with tensorrt_llm 1.2.1, this machine has 1.1.0"),
    (Machine("1.2.1", "10.14.1.48", "13.0", "580", (A100,) * 4),
     "the engines need 4 GPU(s) of compute capability 9.0 (NVIDIA H100 80GB HBM3), this machine has 0 "
     "(NVIDIA A100-SXM4-80GB (SM 8.0))"),
    (h100_machine(num_gpus=2), "the engines need 4 GPU(s) of compute capability 9.0 (NVIDIA H100 80GB HBM3), this "
                               "machine has 2 (NVIDIA H100 80GB HBM3 (SM 9.0))"),
], ids=["older-trtllm", "other-gpu", "too-few-gpus"])
def test_an_engine_artifact_is_served_only_where_it_runs(engine_out: Path, machine: Machine, problem: str) -> None:
    with pytest.raises(KitUsageError) as info:
        servable(engine_out, machine)
    assert str(info.value) == (f"{engine_out} cannot be served here: {problem}; rebuild it on this machine "
                               f"(trtllm-kit build ... --out {engine_out} --force) or serve it where it was built.")


def test_a_cpu_artifact_is_one_process(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--tp", "2", "--pp", "2", "--no-verify", "--out", str(out)]) == 0
    served = servable(out)
    assert (served.target.name, served.world_size, served.artifact.layout.world_size) == ("cpu", 1, 4)
    config = LaunchConfig(repo=served.repo, world_size=served.world_size)
    assert launch_argv(OPT, config)[0] == "/opt/tritonserver/bin/tritonserver"  # no mpirun


def test_plan_for_the_engine_target_on_a_machine_without_tensorrt_llm(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["plan", "builtin:tiny-llama", "--target", "engine", "--gpu", "H100-80GB", "--tp", "2",
                "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == "engine"
    assert report["reason"].startswith("target engine (plan only; a build here would stop: tensorrt_llm is not "
                                       "installed")
    assert report["commands"][0][:5] == ["trtllm-build", "--checkpoint_dir", "checkpoint", "--output_dir", "engines"]
    assert report["plan"]["gpu"]["name"] == "H100-80GB" and not out.exists()
    assert run(["build", "builtin:tiny-llama", "--target", "engine", "--out", str(out)]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("Error: tensorrt_llm is not installed; engines need")
    assert not out.exists()


def test_a_schema_1_manifest_is_refused_then_upgraded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "old"
    out.mkdir()
    shutil.copy(DATA / "schema1-tiny-llama-tp2-pp2.json", out / "manifest.json")  # written by the previous release
    old = json.loads((out / "manifest.json").read_text())
    with pytest.raises(ManifestError) as info:
        Artifact.read(out)
    assert str(info.value) == (f"{out}/manifest.json has schema_version 1; this kit reads 2: run trtllm-kit artifact "
                               f"upgrade {out} (or rebuild it).")
    assert run(["artifact", "upgrade", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}/manifest.json: schema_version 1 → 2"
    artifact = Artifact.read(out)
    assert (artifact.target, artifact.layout.world_size, artifact.precision.dtype) == ("cpu", 4, "bfloat16")
    assert artifact.files == old["outputs"] and artifact.inputs == old["inputs"]
    assert artifact.records.engine is not None
    assert artifact.records.engine.reason == old["summary"]["engine"]["skipped"]
    assert upgrade_manifest(out) == (2, 2)  # idempotent


@pytest.mark.parametrize(("body", "sentence"), [
    ("{", "cannot be read (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); rebuild "
          "the artifact (trtllm-kit build ... --force)."),
    ("[1]", "holds a JSON list, not a manifest object; rebuild the artifact."),
    ('{"schema_version": 9}', "has schema_version 9; this kit reads 2: read it with the trtllm-kit release that "
                              "wrote it, or rebuild the artifact with this one."),
    ('{"schema_version": 2}', "is damaged (KeyError: 'layout'); rebuild the artifact (trtllm-kit build ... --force)."),
], ids=["truncated", "not-an-object", "newer", "damaged"])
def test_unreadable_manifests_get_one_sentence(tmp_path: Path, body: str, sentence: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "manifest.json").write_text(body)
    assert run(["artifact", "verify", str(tmp_path)]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"Error: {tmp_path}/manifest.json {sentence}"
