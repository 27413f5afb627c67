"""The stage cache (hit, miss, --force), archives and ``artifact verify`` (hashes and compatibility)."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes import FakeTrtllmBuild, h100_machine

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.archive import pack_archive, verify_artifact
from trtllm_kit.artifact.machine import Machine, compatibility
from trtllm_kit.build import pipeline
from trtllm_kit.cli import run
from trtllm_kit.gpus import GPU, MIB
from trtllm_kit.models.builtin import builtin_dir, cache_root
from trtllm_kit.targets import get_target

ENGINE_BUILD = ["build", "builtin:tiny-llama", "--tp", "2", "--until", "engine", "--no-verify", "--max-seq-len", "128",
                "--max-batch-size", "4"]


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def build(*argv: str) -> None:
    code = run(list(argv))
    assert code == 0


def test_rerun_reuses_both_stages_and_force_rebuilds(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                                      gpu_host: Machine) -> None:
    out = tmp_path / "out"
    build(*ENGINE_BUILD, "--out", str(out))
    first = manifest(out)
    assert first["cache"]["reused"] == []
    inode = (out / "engines" / "rank1.engine").stat().st_ino

    build(*ENGINE_BUILD, "--out", str(out))  # same inputs, spec and tools: nothing runs again
    second = manifest(out)
    assert second["cache"]["reused"] == ["checkpoint", "engine"]
    assert second["cache"]["stages"] == first["cache"]["stages"]
    assert second["outputs"] == first["outputs"]
    assert second["summary"]["engine"] == first["summary"]["engine"]
    assert len(fake_trtllm_build.calls) == 1
    assert (out / "engines" / "rank1.engine").stat().st_ino == inode  # linked, not rebuilt or copied

    build(*ENGINE_BUILD, "--out", str(out), "--force")
    assert manifest(out)["cache"]["reused"] == []
    assert len(fake_trtllm_build.calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


def test_an_engine_setting_rebuilds_only_the_engine_and_reuses_the_timing_cache(
        tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild, gpu_host: Machine) -> None:
    shutil.rmtree(cache_root() / "timing-cache", ignore_errors=True)  # the session cache: other tests wrote one
    out = tmp_path / "out"
    build(*ENGINE_BUILD, "--out", str(out))
    build(*ENGINE_BUILD, "--out", str(out), "--max-batch-size", "2", "--build-flag", "gemm_plugin=disable")
    after = manifest(out)
    assert after["cache"]["reused"] == ["checkpoint"]
    first, second = (call["argv"] for call in fake_trtllm_build.calls)
    assert "--input_timing_cache" not in first
    cache = dict(zip(second[0::2], second[1::2], strict=True))
    assert cache["--input_timing_cache"] == cache["--output_timing_cache"]
    assert Path(cache["--input_timing_cache"]).name == "nvidia-h100-80gb-hbm3-sm9.0-trt10.14.1.48.cache"
    assert (cache["--max_batch_size"], cache["--gemm_plugin"]) == ("2", "disable")
    assert after["summary"]["engine"]["effective"]["max_batch_size"] == 2


def test_a_checkpoint_setting_rebuilds_both(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                            gpu_host: Machine) -> None:
    out = tmp_path / "out"
    build(*ENGINE_BUILD, "--out", str(out))
    keys = manifest(out)["cache"]["stages"]
    build(*ENGINE_BUILD, "--out", str(out), "--dtype", "float16")
    after = manifest(out)
    assert after["cache"]["reused"] == []
    assert all(after["cache"]["stages"][k] != keys[k] for k in ("checkpoint", "engine"))
    assert len(fake_trtllm_build.calls) == 2


def test_inputs_are_keyed_by_content(tmp_path: Path) -> None:
    """A touched file (new mtime) is hashed again and still matches; a changed byte is a miss."""
    model = tmp_path / "model"
    shutil.copytree(builtin_dir("tiny-llama"), model)
    out = tmp_path / "out"
    argv = ["build", str(model), "--until", "checkpoint", "--no-verify", "--target", "cpu", "--out", str(out)]
    build(*argv)
    weights = model / "model.safetensors"
    os.utime(weights, ns=(1, 1))
    build(*argv)
    assert manifest(out)["cache"]["reused"] == ["checkpoint"]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor
    weights.write_bytes(bytes(data))
    build(*argv)
    assert manifest(out)["cache"]["reused"] == []


def test_calibration_text_is_keyed_by_content(tmp_path: Path) -> None:
    """Editing the --calib-data file (same path) calibrates and converts again."""
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n" * 20)
    out = tmp_path / "out"
    argv = ["build", "builtin:tiny-llama", "--until", "checkpoint", "--no-verify", "--target", "cpu", "--out", str(out),
            "--kv-cache", "int8", "--calib-data", str(text), "--calib-samples", "2", "--calib-seq-len", "32"]
    build(*argv)
    build(*argv)
    assert manifest(out)["cache"]["reused"] == ["checkpoint"]
    text.write_text("Numbers: 1 2 3 4 5 6 7 8 9 10, and more numbers 11 12 13.\n" * 20)
    build(*argv)
    assert manifest(out)["cache"]["reused"] == []


def test_plan_shows_the_cache_status(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild, gpu_host: Machine,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    flags = [*ENGINE_BUILD[1:], "--out", str(out), "--json"]

    def stages(*argv: str) -> list[tuple[str, str]]:
        assert run(list(argv)) == 0
        return [(s["stage"], s["status"]) for s in json.loads(capsys.readouterr().out)["stages"]]

    assert stages("plan", *flags) == [("checkpoint", "will build"), ("engine", "will build")]
    build(*ENGINE_BUILD, "--out", str(out))
    capsys.readouterr()
    assert stages("plan", *flags) == [("checkpoint", "cached"), ("engine", "cached")]
    assert stages("build", "--dry-run", *flags) == [("checkpoint", "cached"), ("engine", "cached")]
    without_out = [f for f in flags if f not in ("--out", str(out))]
    assert run(["build", "--dry-run", *without_out]) == run(["plan", *without_out]) == 0  # both default to out/
    first, second = capsys.readouterr().out.split("\n}\n", 1)
    assert json.loads(first + "}") == json.loads(second)
    assert stages("plan", *flags, "--max-batch-size", "2") == [("checkpoint", "cached"), ("engine", "will build")]
    assert stages("plan", *flags, "--verify") == [("checkpoint", "will build"), ("engine", "will build")]
    assert run(["plan", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["commands"] == [manifest(out)["summary"]["engine"]["command"]]
    assert len(fake_trtllm_build.calls) == 1  # planning never compiles


# --- archives and artifact verify ------------------------------------------------------------------------------


@pytest.fixture
def engine_artifact(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild, gpu_host: Machine) -> Path:
    out = tmp_path / "out"
    build(*ENGINE_BUILD, "--out", str(out), "--archive", str(tmp_path / "out.tar.gz"))
    return out


def test_archive_round_trip(engine_artifact: Path, tmp_path: Path) -> None:
    archive = tmp_path / "out.tar.gz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert names[0] == "manifest.json"
        tar.extractall(tmp_path / "unpacked", filter="data")
    unpacked = tmp_path / "unpacked"
    on_disk = sorted(str(p.relative_to(engine_artifact)) for p in engine_artifact.rglob("*") if p.is_file())
    assert sorted(names) == on_disk
    for name in on_disk:
        assert (unpacked / name).read_bytes() == (engine_artifact / name).read_bytes()
    machine = h100_machine()
    for source in (engine_artifact, archive, unpacked):
        report = verify_artifact(source, problems_on(machine))
        assert (report.hashes_ok, report.problems, report.has_engines) == (True, [], True)
        assert report.num_files == len(on_disk) - 1
    again = pack_archive(engine_artifact, tmp_path / "again.tar.gz")
    assert again.read_bytes() == archive.read_bytes()  # reproducible bytes


def test_flipped_byte_is_caught_in_a_directory(engine_artifact: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("trtllm_kit.artifact.machine.detect_machine", h100_machine)
    assert run(["artifact", "verify", str(engine_artifact)]) == 0
    assert capsys.readouterr().out.endswith("hashes ok; engines compatible with this machine\n")
    rank = engine_artifact / "checkpoint" / "rank1.safetensors"
    data = bytearray(rank.read_bytes())
    data[len(data) // 2] ^= 0x40
    rank.write_bytes(bytes(data))
    (engine_artifact / "engines" / "rank0.engine").unlink()
    assert run(["artifact", "verify", str(engine_artifact), "--hashes-only"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"Error: {engine_artifact} does not match its manifest: 1 changed (checkpoint/rank1.safetensors); 1 missing "
        "(engines/rank0.engine); the artifact is corrupt or was modified: rebuild or fetch it again.")


def test_flipped_byte_is_caught_in_an_archive(engine_artifact: Path, tmp_path: Path) -> None:
    archive = pack_archive(engine_artifact, tmp_path / "plain.tar")
    with tarfile.open(archive) as tar:
        member = tar.getmember("engines/rank1.engine")
    data = bytearray(archive.read_bytes())
    data[member.offset_data + 3] ^= 0x01
    archive.write_bytes(bytes(data))
    report = verify_artifact(archive, problems_on(h100_machine()))
    assert (report.mismatched, report.missing, report.unexpected) == (["engines/rank1.engine"], [], [])


def test_incompatible_machines_are_reported(engine_artifact: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    built = Artifact.read(engine_artifact)
    a100 = GPU("NVIDIA A100-SXM4-80GB", 81920 * MIB, (8, 0), "nvml")
    cases = [
        (h100_machine(), []),
        (h100_machine(num_gpus=8), []),
        (Machine(None, None, None, None, ()), [
            "the engines were built with tensorrt_llm 1.2.1, this machine has none",
            "the engines were built with TensorRT 10.14.1.48, this machine has none",
            "the engines need 2 GPU(s) of compute capability 9.0, none is visible"]),
        (h100_machine(tensorrt_llm="1.1.0"),
         ["the engines were built with tensorrt_llm 1.2.1, this machine has 1.1.0"]),
        (Machine("1.2.1", "10.14.1.48", "13.0", "580", (a100, a100)), [
            "the engines need 2 GPU(s) of compute capability 9.0 (NVIDIA H100 80GB HBM3), this machine has 0 "
            "(NVIDIA A100-SXM4-80GB (SM 8.0))"]),
        (h100_machine(num_gpus=1), [
            "the engines need 2 GPU(s) of compute capability 9.0 (NVIDIA H100 80GB HBM3), this machine has 1 "
            "(NVIDIA H100 80GB HBM3 (SM 9.0))"]),
    ]
    for machine, problems in cases:
        assert compatibility(built, machine) == problems
    monkeypatch.setattr("trtllm_kit.artifact.machine.detect_machine", lambda: cases[3][0])
    assert run(["artifact", "verify", str(engine_artifact)]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"Error: {engine_artifact} is intact but its engines cannot run here: the engines were built with tensorrt_llm "
        "1.2.1, this machine has 1.1.0; rebuild on this machine or pass --hashes-only to check the files alone.")
    assert run(["artifact", "verify", str(engine_artifact), "--hashes-only", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["hashes_ok"], report["compatible"], report["has_engines"]) == (True, False, True)


def test_cpu_artifacts_have_no_engine_requirements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    build("build", "builtin:tiny-llama", "--until", "checkpoint", "--no-verify", "--out", str(out), "--archive",
          str(tmp_path / "a.tar"))
    assert compatibility(Artifact.read(out), Machine(None, None, None, None, ())) == []
    assert run(["artifact", "verify", str(tmp_path / "a.tar")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("hashes ok; no engines")


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.tar", None, "{path} does not exist; pass an artifact directory or an archive made by --archive."),
    ("junk.tar", b"not a tar at all" * 64, "{path} is not a readable tar archive"),
    ("bad.zip", b"", "--archive {path} must end in .tar, .tar.gz or .tgz."),
])
def test_bad_archive_paths(name: str, content: bytes | None, message: str, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    if name.endswith(".zip"):
        out = tmp_path / "out"
        code = run(["build", "builtin:tiny-llama", "--until", "checkpoint", "--no-verify", "--out", str(out),
                    "--archive", str(path)])
    else:
        code = run(["artifact", "verify", str(path)])
    assert code in (1, 2)
    assert capsys.readouterr().err.splitlines()[-1].startswith("Error: " + message.format(path=path))


def test_the_ci_example_config_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).parents[2] / "examples" / "ci"
    config = tmp_path / "trtllm-kit.toml"
    text = (example / "trtllm-kit.toml").read_text()
    model = Path(__file__).parents[1] / "data" / "hf-configs" / "meta-llama--Meta-Llama-3-8B"
    config.write_text(text.replace('"meta-llama/Meta-Llama-3-8B"', f'"{model}"'))
    assert run(["plan", "--config", str(config), "--until", "engine", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["plan"]["gpu"]["name"], report["plan"]["tp_size"], report["plan"]["max_seq_len"]) == (
        "H100-80GB", 2, 8192)
    assert "--multiple_profiles" in report["commands"][0]
    workflow = (example / "github-actions.yml").read_text()
    for command in ("trtllm-kit plan --config trtllm-kit.toml", "--until checkpoint --target cpu --archive",
                    "--until engine --target engine", "trtllm-kit artifact verify engines.tar"):
        assert command in workflow


def problems_on(machine: Machine) -> Callable[[Artifact], list[str]]:
    """What keeps an artifact from being served on ``machine``, as its target says."""
    return lambda artifact: get_target(artifact.target).serve_problems(artifact, machine)


def test_the_verify_texts_are_in_the_checkpoint_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A cached checkpoint keeps its verify figures only while the held-out text they were measured on is the same."""
    out = tmp_path / "out"
    argv = ["builtin:tiny-llama", "--until", "checkpoint", "--verify", "--target", "cpu", "--out", str(out), "--json"]
    build("build", *argv)
    capsys.readouterr()

    def checkpoint_status() -> str:
        assert run(["plan", *argv]) == 0
        return json.loads(capsys.readouterr().out)["stages"][0]["status"]

    assert checkpoint_status() == "cached"
    edited = tmp_path / "heldout.txt"
    edited.write_text(pipeline.heldout_path().read_text(encoding="utf-8") + "One more held-out line.\n")
    monkeypatch.setattr(pipeline, "heldout_path", lambda: edited)
    assert checkpoint_status() == "will build"
