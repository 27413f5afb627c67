"""The inputs' sha256 begun in a child process before the build loads torch: exact digests in the manifest, reuse
unchanged, a failed build leaves no process and nothing at the output path, and a file the child could not hash
is hashed (or refused) as before."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trtllm_kit.build.cache import BackgroundDigests, Previous, input_digests, likely_inputs
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


def hash_children(parent: int | None = None, hashing: Path | None = None) -> list[int]:
    """Pids of ``parent``'s children (this process's by default) that run the hashing, alive or not yet reaped,
    of files under ``hashing`` when given."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"hash_child" in cmdline \
                and (hashing is None or str(hashing).encode() in cmdline):
            found.append(int(entry.name))
    return found


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


def test_a_failing_build_ends_the_hashing_and_leaves_nothing(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A model directory whose 2 GB weight file is still being hashed when the build refuses it (its header is
    not safetensors): the child is ended, and nothing is written."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((builtin_dir("tiny-llama") / "config.json").read_text())
    with (model / "model.safetensors").open("wb") as f:
        f.write(b"\xff" * 8)
        f.truncate(2 * 1024**3)
    out = tmp_path / "out"
    assert run([*BUILD[:1], str(model), *BUILD[2:], "--out", str(out)]) == 1
    assert "model.safetensors is truncated or not a safetensors file" in capsys.readouterr().err
    assert hash_children() == [] and non_daemon_threads() == set()
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging directory either


def test_the_child_digests_equal_hashlib_and_unreadable_files_are_left_out(tmp_path: Path) -> None:
    present, missing, empty = tmp_path / "present.bin", tmp_path / "missing.bin", tmp_path / "empty.bin"
    present.write_bytes(b"weights" * 1000)
    empty.write_bytes(b"")
    previous = Previous(tmp_path, None)
    with BackgroundDigests([present, missing, empty], previous) as digests:
        known = digests.result()
    assert known == {"present.bin": ([7000, present.stat().st_mtime_ns], sha256(present)),
                     "empty.bin": ([0, empty.stat().st_mtime_ns], sha256(empty))}
    with pytest.raises(FileNotFoundError) as refused:  # the missing file: refused as without the child
        input_digests([present, missing], previous, known)
    assert "missing.bin" in str(refused.value)
    assert hash_children() == []


def test_a_file_changed_after_its_early_digest_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"one")
    previous = Previous(tmp_path, None)
    with BackgroundDigests([path], previous) as digests:
        known = digests.result()
    time.sleep(0.01)
    path.write_bytes(b"two")
    os.utime(path, ns=(time.time_ns(), known[path.name][0][1] + 1_000_000))
    assert input_digests([path], previous, known) == {path.name: sha256(path)}


def test_likely_inputs_are_a_directory_s_config_and_safetensors(tmp_path: Path) -> None:
    for name in ("config.json", "b.safetensors", "a.safetensors", "pytorch_model.bin", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    calib = tmp_path / "calib.txt"
    calib.write_text("text")
    assert likely_inputs(str(tmp_path), str(calib)) == \
        [tmp_path / "config.json", tmp_path / "a.safetensors", tmp_path / "b.safetensors", calib]
    assert likely_inputs("builtin:tiny-llama", None) == []


def test_leaving_the_block_kills_a_child_still_hashing(tmp_path: Path) -> None:
    big = tmp_path / "model.safetensors"
    with big.open("wb") as f:
        f.truncate(64 * 1024**3)  # sparse: tens of seconds of hashing
    with BackgroundDigests([big], Previous(tmp_path, None)) as digests:
        assert len(hash_children()) == 1
    assert digests._child is not None and digests._child.returncode == -signal.SIGKILL
    assert hash_children() == []


def test_a_killed_build_s_hash_child_ends_with_it(tmp_path: Path) -> None:
    """SIGKILL leaves the build no chance to end its child: the child sees its parent gone and stops. The one file
    is a large one, so the child has nothing to print (a print to the dead parent's pipe would end it too)."""
    model = tmp_path / "model"
    model.mkdir()
    with (model / "model.safetensors").open("wb") as f:
        f.truncate(64 * 1024**3)  # sparse: tens of seconds of hashing
    build = subprocess.Popen([sys.executable, "-m", "trtllm_kit", *BUILD[:1], str(model), *BUILD[2:], "--out",
                              str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not hash_children(build.pid, model) and time.monotonic() < deadline:
        time.sleep(0.02)
    child = hash_children(build.pid, model)
    assert child, "the build started no hash child"
    build.kill()
    assert build.wait(timeout=60) == -signal.SIGKILL
    while running(child[0]) and time.monotonic() < deadline:  # a hang guard, not a speed bound
        time.sleep(0.05)
    assert not running(child[0])


def running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie waits only to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

