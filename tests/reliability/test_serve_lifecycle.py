"""The serve's life against a real tritonserver: a hung engine is a dead one, a killed server is named, an abort
at start-up is retried once, ``reload`` refuses what is not a new version of the served model and survives a
SIGKILL mid-way, and a non-streamed request whose client leaves stops the engine.

Before these changes: after SIGSTOP of the ``tensorrt_llm`` stub, readiness stayed 200 and in-flight streams hung
until their clients gave up (40 s); a qwen2 artifact reloaded under a llama name without a word; a corrupt manifest
given to ``reload`` was "the reload failed"; a start-up abort (``boost::interprocess::lock_exception``) ended
``serve``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from kit_server import BuildKey, Builds
from reliability_helpers import KIT, error_line, kit
from serving_helpers import (
    LONG,
    MODEL,
    assert_stops,
    leave_a_whole_request,
    open_stream,
    read_rest,
    ready,
    serve,
    serve_exits,
    stubs,
    wait_gone,
)

from trtllm_kit.errors import KitError
from trtllm_kit.serve.server.launcher import LaunchConfig, free_endpoints, launch_argv
from trtllm_kit.serve.server.locate import locate_tritonserver
from trtllm_kit.serve.server.process import TritonProcess
from trtllm_kit.serve.server.state import read_state, run_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]
WATCHDOG_S = 3


def test_a_stopped_engine_is_treated_as_dead(artifact_copy: Path) -> None:
    state = serve(artifact_copy, engine_watchdog_s=WATCHDOG_S)
    engine = stubs(state)["tensorrt_llm"]
    sock = open_stream(state, {**LONG, "stream": True})
    os.kill(engine, signal.SIGSTOP)
    try:
        rest = read_rest(sock, timeout_s=60)  # hang guard; the watchdog ends it after WATCHDOG_S
        assert b'"type": "server_error"' in rest, rest[-400:]
        assert not ready(state)
        assert serve_exits(state["pid"], timeout_s=30)
        wait_gone(state, timeout_s=10)
    finally:
        if psutil.pid_exists(engine):
            os.kill(engine, signal.SIGCONT)
    log = (run_dir(artifact_copy) / "serve.log").read_text()
    assert f"Error: the engine of model tensorrt_llm (stub pid {engine}) made no step for " in log, log[-2000:]
    assert f"(watchdog {WATCHDOG_S} s, --engine-watchdog); it is treated as dead; serve stopped" in log
    assert "Traceback" not in log


def test_a_stopped_idle_stub_is_treated_as_dead(artifact_copy: Path) -> None:
    state = serve(artifact_copy, engine_watchdog_s=WATCHDOG_S)
    stub = stubs(state)["postprocessing"]
    os.kill(stub, signal.SIGSTOP)  # it holds nothing, so it writes no heartbeat: its process state tells
    assert serve_exits(state["pid"], timeout_s=60)
    wait_gone(state, timeout_s=10)
    log = (run_dir(artifact_copy) / "serve.log").read_text()
    assert f"Error: the Python-backend stub of model postprocessing (pid {stub}) has been stopped for " in log, \
        log[-2000:]


def test_no_ensemble_by_default_a_whole_request_left_stops_the_engine_and_a_killed_server_is_named(
        artifact_copy: Path) -> None:
    state = serve(artifact_copy)
    assert "ensemble" not in state["routes"][0]["models"]  # it cannot cancel: loaded only with --ensemble
    assert not _answers(f"http://{state['http']}/v2/models/ensemble/ready")
    assert _answers(f"http://{state['http']}/v2/models/tensorrt_llm_bls/ready")
    assert_stops(state, leave_a_whole_request(state))

    os.kill(state["server_pid"], signal.SIGKILL)
    assert serve_exits(state["pid"], timeout_s=30)
    wait_gone(state, timeout_s=10)
    log = (run_dir(artifact_copy) / "serve.log").read_text()
    assert "Error: tritonserver exited with code -9 while serving" in log, log[-2000:]
    assert "stub" not in log.split("Error: ", 1)[1].split(";", 1)[0]


def test_reload_refuses_another_model_and_a_corrupt_manifest_and_survives_a_kill(
        artifact_copy: Path, tiny_artifact: Path, tmp_path: Path, kit_builds: Builds) -> None:
    qwen = kit_builds.copy(BuildKey.of("builtin:tiny-qwen2"), tmp_path / "qwen")  # verify off, one instance each
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_artifact, corrupt)
    (corrupt / "manifest.json").write_text('{"schema_version": ')
    again = tmp_path / "again"
    shutil.copytree(tiny_artifact, again)
    state = serve(artifact_copy)
    _refused(artifact_copy, qwen, corrupt)

    reload = subprocess.Popen([*KIT, "reload", MODEL, str(again), "--out", str(artifact_copy)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    repo = run_dir(artifact_copy) / "repo"
    deadline = time.monotonic() + 120
    while not any("__v2__" in a for p in _processes_naming(repo) for a in p.info["cmdline"]):  # v2's stubs start
        assert time.monotonic() < deadline and reload.poll() is None, reload.stderr.read() if reload.stderr else ""
        time.sleep(0.01)
    os.kill(state["pid"], signal.SIGKILL)
    _, stderr = reload.communicate(timeout=60)
    assert reload.returncode == 1 and "ended before it answered the reload" in stderr, stderr
    wait_gone(state, timeout_s=15)
    assert not _processes_naming(run_dir(artifact_copy))

    state = serve(artifact_copy)  # the next serve of the same OUT starts clean
    assert [r["version"] for r in state["routes"]] == [1]
    assert not any("__v2__" in p.name for p in repo.iterdir())
    assert not (run_dir(artifact_copy) / "reloads").exists()
    done = kit("stop", str(artifact_copy), timeout=60)
    assert done.returncode == 0, done.stderr
    wait_gone(state, timeout_s=10)


def _refused(served: Path, qwen: Path, corrupt: Path) -> None:
    done = kit("reload", MODEL, str(qwen), "--out", str(served))
    assert done.returncode == 2, done.stderr
    line = error_line(done)
    assert line.startswith(f"{qwen} is not a new version of {MODEL}: its model family is qwen2, the served one's "
                           "llama; pass --force"), line  # the builtin models share one tokenizer
    done = kit("reload", MODEL, str(corrupt), "--out", str(served))
    assert done.returncode == 2, done.stderr
    line = error_line(done)
    assert line.startswith(f"{corrupt / 'manifest.json'} cannot be read"), line
    assert read_state(served)["routes"][0]["version"] == 1  # nothing changed


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def _processes_naming(directory: Path) -> list[psutil.Process]:
    """Live processes whose command line names a path under ``directory`` (stubs name their ``model.py``)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(str(directory) in a for a in proc.info["cmdline"] or []):
            found.append(proc)
    return found


MODEL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return []
"""
CONFIG = 'name: "echo"\nbackend: "python"\nmax_batch_size: 0\n' \
         'input { name: "x" data_type: TYPE_INT32 dims: [1] }\noutput { name: "y" data_type: TYPE_INT32 dims: [1] }\n'


def _aborting_server(tmp_path: Path, times: int) -> tuple[TritonProcess, Path]:
    """A server whose first ``times`` starts abort (SIGABRT) before they run the real tritonserver."""
    install = locate_tritonserver()
    (tmp_path / "repo" / "echo" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "echo" / "1" / "model.py").write_text(MODEL_PY)
    (tmp_path / "repo" / "echo" / "config.pbtxt").write_text(CONFIG)
    starts = tmp_path / "starts"
    stand_in = tmp_path / "tritonserver"
    stand_in.write_text(f"#!/bin/sh\necho start >> {starts}\n"
                        f"if [ $(wc -l < {starts}) -le {times} ]; then echo 'terminate called after throwing an "
                        "instance of boost::interprocess::lock_exception'; kill -ABRT $$; fi\n"
                        f'exec {install.server} "$@"\n')
    stand_in.chmod(0o755)
    config = LaunchConfig(repo=tmp_path / "repo", endpoints=free_endpoints(), shm_prefix=f"lifecycle{os.getpid()}_")
    argv = [str(stand_in), *launch_argv(install, config)[1:]]
    return TritonProcess(install, config, tmp_path / "tritonserver.log", argv=argv), starts


def test_an_abort_at_start_up_is_said_and_retried_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    process, starts = _aborting_server(tmp_path, times=1)
    restarted: list[int] = []
    process.start()
    with caplog.at_level(logging.WARNING, logger="trtllm_kit.serve.server.process"):
        try:
            process.wait_ready_or_restart(120, on_restart=restarted.append)
            assert process.is_ready()
        finally:
            process.stop(grace_s=5)
    assert starts.read_text().count("start") == 2
    assert restarted == [process.pid]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("tritonserver exited with code -6 while starting (it aborted; log ")
    assert said[0].endswith("; starting it once more"), said


def test_a_second_abort_is_not_retried(tmp_path: Path) -> None:
    process, starts = _aborting_server(tmp_path, times=2)
    process.start()
    with pytest.raises(KitError, match=r"it aborted twice, so it was not started again\.$"):
        process.wait_ready_or_restart(120, on_restart=lambda pid: None)
    assert starts.read_text().count("start") == 2

