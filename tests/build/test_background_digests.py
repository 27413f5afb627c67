"""The inputs' sha256 computed beside the stages: exact digests in the manifest, reuse unchanged, and a failed
build (or a failed hash) leaves no thread running and nothing at the output path."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from trtllm_kit.build.cache import BackgroundDigests, Previous, input_digests
from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir

BUILD = ["build", "builtin:tiny-llama", "--target", "llmapi", "--quant", "fp8", "--until", "checkpoint",
         "--no-verify", "--calib-samples", "2", "--calib-seq-len", "16"]


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def non_daemon_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()}


def test_manifest_digests_are_the_files_sha256_fresh_forced_and_reused(tmp_path: Path) -> None:
    model = builtin_dir("tiny-llama")
    expected = {p.name: sha256(p) for p in [model / "config.json", *sorted(model.glob("*.safetensors"))]}
    out = tmp_path / "out"
    assert run([*BUILD, "--out", str(out)]) == 0
    fresh = manifest(out)
    assert fresh["inputs"] == expected and fresh["cache"]["reused"] == []
    assert run([*BUILD, "--out", str(out), "--force"]) == 0
    forced = manifest(out)
    assert forced["inputs"] == expected and forced["cache"]["reused"] == []
    assert forced["cache"]["stages"] == fresh["cache"]["stages"]
    assert run([*BUILD, "--out", str(out)]) == 0
    again = manifest(out)
    assert again["inputs"] == expected and again["cache"]["reused"] == ["checkpoint"]
    assert again["cache"]["stages"] == fresh["cache"]["stages"] and again["outputs"] == forced["outputs"]
    assert non_daemon_threads() == set()


def test_a_failing_stage_stops_the_hashing_and_leaves_nothing(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The calibration text is an input (hashed) that the checkpoint stage refuses: a bad first byte, then 256 MB,
    so the stage fails while the hash is still under way."""
    data = tmp_path / "calib.txt"
    with data.open("wb") as f:
        f.write(b"\xff")
        f.truncate(256 * 1024 * 1024)
    out = tmp_path / "out"
    before = non_daemon_threads()
    assert run([*BUILD, "--calib-data", str(data), "--out", str(out)]) == 2
    assert "--calib-data " + str(data) + " cannot be read ('utf-8' codec can't decode byte 0xff" in \
        capsys.readouterr().err
    assert non_daemon_threads() == before == set()
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "calib.txt"] == []  # no staging directory either


def test_a_failed_hash_raises_what_hashing_raises(tmp_path: Path) -> None:
    present, missing = tmp_path / "present.bin", tmp_path / "missing.bin"
    present.write_bytes(b"weights")
    previous = Previous(tmp_path, None)
    with pytest.raises(FileNotFoundError) as direct:
        input_digests([present, missing], previous)
    with BackgroundDigests([present, missing], previous) as digests, pytest.raises(FileNotFoundError) as background:
        digests.result()
    assert str(background.value) == str(direct.value)
    assert non_daemon_threads() == set()
    with BackgroundDigests([present], previous) as digests:
        assert digests.result() == {"present.bin": sha256(present)}
