"""Item 11: builds killed with SIGKILL, interrupted with SIGINT at random points, or starved of disk space leave
nothing behind (or the next build reclaims it), and say so in one line with the right exit code."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from polling import wait_until
from reliability_helpers import KIT, MODEL, error_line, kit, leftovers

from trtllm_kit.owner import owner_tag

pytestmark = pytest.mark.slow

# SIGINT moments: one seeded random point in each of NUM_SIGINT_TRIES equal slices of [0.3 s, 3.5 s), so the tries
# are spread over every phase of the build (start-up, conversion, repository, verify) for sure, no two more than two
# slices apart; twenty plain random points could cluster, and took twice as long.
NUM_SIGINT_TRIES = 10
SIGINT_FROM_S, SIGINT_TO_S = 0.3, 3.5


def wait_for(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.02) -> bool:
    return wait_until(predicate, timeout_s, poll_s)


def test_a_killed_build_leaves_staging_that_the_next_build_reclaims(tmp_path: Path) -> None:
    out = tmp_path / "out"
    build = subprocess.Popen([*KIT, "build", MODEL, "--until", "checkpoint", "--out", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: leftovers(tmp_path), 60), "the build never created its staging directory"
    finally:
        build.kill()
        build.wait(10)
    stale = leftovers(tmp_path)
    assert len(stale) == 1 and stale[0].startswith(f".out.{build.pid}-") and stale[0].endswith(".partial")
    alive = tmp_path / f".out.{owner_tag()}.abcdefgh.partial"  # a concurrent build's (this process is alive)
    alive.mkdir()

    done = kit("build", MODEL, "--until", "checkpoint", "--no-verify", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert re.search(rf"removed {re.escape(stale[0])} \([\d.]+ MB\), left by a build that was killed",
                     " ".join(done.stderr.split()))
    assert leftovers(tmp_path) == [alive.name]
    assert kit("artifact", "verify", str(out)).returncode == 0


def test_sigint_at_random_points_always_ends_with_130_and_nothing_changed(tiny_artifact: Path,
                                                                          tmp_path: Path) -> None:
    """A previous artifact sits in --out; --force rebuilds every stage, verify included (transformers and its
    ``regex`` finalizers run there), and each try is interrupted at a seeded random moment."""
    out = tmp_path / "out"
    shutil.copytree(tiny_artifact, out)
    manifest = (out / "manifest.json").read_bytes()
    rng = random.Random(16)
    width = (SIGINT_TO_S - SIGINT_FROM_S) / NUM_SIGINT_TRIES
    interrupted = 0
    for attempt in range(NUM_SIGINT_TRIES):
        delay = SIGINT_FROM_S + width * (attempt + rng.random())
        build = subprocess.Popen([*KIT, "build", MODEL, "--force", "--verify", "--instances", "1", "--out", str(out)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        if build.poll() is None:
            build.send_signal(signal.SIGINT)
            interrupted += 1
        try:
            _, stderr = build.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            build.kill()
            pytest.fail(f"try {attempt}: the build went on for 60 s after SIGINT at {delay:.2f} s")
        context = f"try {attempt}, SIGINT at {delay:.2f} s: {stderr}"
        if build.returncode == 0:  # finished before the signal was sent
            manifest = (out / "manifest.json").read_bytes()
            continue
        assert build.returncode == 130, context
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, context
        assert stderr.rstrip().splitlines()[-1] == "Error: interrupted; nothing was written.", context
        assert leftovers(tmp_path) == [], context
        assert (out / "manifest.json").read_bytes() == manifest, context
    assert interrupted >= NUM_SIGINT_TRIES // 2
    assert kit("artifact", "verify", str(out)).returncode == 0


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(),
                                reason="a private tmpfs needs root and unshare")


def in_tmpfs(script: str, size: str, mount: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) in a private mount namespace where ``mount`` is a fresh tmpfs of ``size``."""
    mount.mkdir()
    setup = f"mount -t tmpfs -o size={size} tmpfs {mount} && mountpoint -q {mount} && cd {mount} && ( {script} )"
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", setup],
                          capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))


@needs_root
def test_a_file_system_too_small_is_refused_before_any_work(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    kit_cmd = " ".join(f"'{a}'" for a in KIT)
    done = in_tmpfs(f"{kit_cmd} build {MODEL} --until checkpoint --no-verify --out {mount}/out; echo rc=$?; "
                    "ls -A", "1m", mount)
    assert "rc=1" in done.stdout, done.stderr
    assert re.fullmatch(rf"--out {mount}/out needs about [\d.]+ MB but the file system of {mount} has 1\.0 MB free; "
                        r"free [\d.]+ MB or choose another --out\.", error_line(done)), done.stderr
    assert done.stdout.split("rc=1")[1].split() == []  # nothing left in the tmpfs


@needs_root
def test_a_disk_that_fills_up_mid_build_names_the_file_and_the_space(tmp_path: Path) -> None:
    """The tmpfs has room when the build starts; as soon as its staging directory appears, the rest of the file
    system is taken (zeros written until the disk is full, whatever the build writes meanwhile), so a later write
    of the build fails with ENOSPC."""
    mount = tmp_path / "fills"
    kit_cmd = " ".join(f"'{a}'" for a in KIT)
    script = (f"{kit_cmd} build {MODEL} --instances 1 --out {mount}/out & pid=$!; "
              "i=0; while [ $i -lt 3000 ] && ! ls -d .out.*.partial >/dev/null 2>&1; do sleep 0.01; i=$((i+1)); "
              f"done; mountpoint -q {mount} && dd if=/dev/zero of={mount}/filler bs=64k 2>/dev/null; "
              "wait $pid; echo rc=$?; ls -A")
    done = in_tmpfs(script, "16m", mount)
    assert "rc=1" in done.stdout, done.stdout + done.stderr
    message = error_line(done)
    match = re.fullmatch(rf"no space left on the file system of {mount} while writing (\S+) \(([\d.]+ [KM]?B) "
                         r"written\): the build needs about ([\d.]+) MB and ([\d.]+ [KM]?B) is free; free space or "
                         r"choose another --out\.", message)
    assert match, message
    assert match.group(1).startswith(("checkpoint/", "tokenizer/", "repo/")), message
    assert done.stdout.split("rc=1")[1].split() == ["filler"]  # no staging directory, no out


@needs_root
@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_an_archive_onto_a_full_disk_names_the_file_and_the_space(tiny_artifact: Path, tmp_path: Path,
                                                                  suffix: str) -> None:
    """A plain tar that cannot fit is refused before writing; a compressed one fails at the write (ENOSPC). Either
    way the artifact is complete, and no partial archive is left."""
    mount = tmp_path / "small"
    out = tmp_path / "out"
    shutil.copytree(tiny_artifact, out)
    kit_cmd = " ".join(f"'{a}'" for a in KIT)
    done = in_tmpfs(f"{kit_cmd} build {MODEL} --no-verify --instances 1 --out {out} --force --archive "
                    f"{mount}/a{suffix}; echo rc=$?; ls -A", "1m", mount, timeout_s=300)
    assert "rc=1" in done.stdout, done.stdout + done.stderr
    message = error_line(done)
    if suffix == ".tar":
        pattern = (rf"--archive {mount}/a\.tar needs about [\d.]+ MB but the file system of {mount} has 1\.0 MB free; "
                   r"free [\d.]+ MB or choose another --archive path\.")
    else:
        pattern = (rf"no space left on the file system of {mount} while writing --archive a\.tar\.gz \([\d.]+ [KM]?B "
                   r"written\): the artifact holds [\d.]+ MB and [\d.]+ [KM]?B is free; free space or choose another "
                   r"--archive path\.")
    assert re.fullmatch(pattern, message), message
    assert done.stdout.split("rc=1")[1].split() == []  # no partial archive
    assert kit("artifact", "verify", str(out)).returncode == 0
