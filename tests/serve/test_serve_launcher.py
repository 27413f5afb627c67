"""The tritonserver/mpirun command lines, busy ports, readiness failures and the manifest check."""

from __future__ import annotations

import http.server
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.openai.text import StopMatcher
from trtllm_kit.serve.options import Endpoints
from trtllm_kit.serve.servable import servable
from trtllm_kit.serve.server.hidden_args import HiddenArgs, trace_me
from trtllm_kit.serve.server.launcher import (
    EPHEMERAL_RANGE,
    LOWEST_FREE_PORT,
    LaunchConfig,
    check_ports_free,
    free_endpoints,
    free_port,
    launch_argv,
)
from trtllm_kit.serve.server.listeners import held_by
from trtllm_kit.serve.server.locate import TritonInstall, locate_tritonserver
from trtllm_kit.serve.server.process import TritonProcess, group_alive
from trtllm_kit.serve.server.reaper import SHM_DIR

OPT = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), "/opt/tritonserver",
                    backend_dir=Path("/opt/tritonserver/backends"))
SHM = ["--backend-config=python,shm-default-byte-size=4194304", "--backend-config=python,shm-growth-byte-size=1048576",
       "--backend-config=python,thread-pool-size=256"]


def test_single_process_argv() -> None:
    config = LaunchConfig(Path("/r"), Endpoints("0.0.0.0", 9000, 9001, 9002), shm_prefix="trtllmkit_7_",
                          log_verbose=1, exit_timeout_s=3)
    assert launch_argv(OPT, config) == [
        "/opt/tritonserver/bin/tritonserver", "--model-repository=/r", "--disable-auto-complete-config",
        "--backend-directory=/opt/tritonserver/backends",
        "--http-address=0.0.0.0", "--http-port=9000", "--grpc-address=0.0.0.0", "--grpc-port=9001",
        "--metrics-address=0.0.0.0", "--metrics-port=9002", "--strict-readiness=true", "--log-verbose=1",
        "--exit-on-error=true", "--exit-timeout-secs=3",
        "--backend-config=python,shm-region-prefix-name=trtllmkit_7_0_", *SHM]


@pytest.mark.parametrize(("keyed", "apis"), [
    (False, "model-repository,shared-memory,trace,logging"),
    (True, "model-repository,shared-memory,trace,logging,metadata,inference,model-config,statistics")])
def test_the_token_restricts_the_admin_apis_always_and_inference_with_keys(keyed: bool, apis: str) -> None:
    config = LaunchConfig(Path("/r"), restricted_token="T0K", restrict_inference=keyed)
    argv = launch_argv(OPT, config)
    assert f"--http-restricted-api={apis}:trtllm-kit-token=T0K" in argv
    assert f"--grpc-restricted-protocol={apis}:trtllm-kit-token=T0K" in argv
    assert not any("restricted" in arg for arg in launch_argv(OPT, LaunchConfig(Path("/r"))))


def test_a_hidden_argument_reaches_the_child_but_not_its_cmdline() -> None:
    code = "import sys; print(sys.argv[1]); print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[3])"
    hidden = HiddenArgs([sys.executable, "-c", code, "--restricted=api:key=S3CRET"], "S3CRET")
    assert hidden.shown()[-1] == "--restricted=api:key=<hidden>"
    child = subprocess.Popen(hidden.shown(), env={**os.environ, **hidden.environment()}, preexec_fn=trace_me,
                             stdout=subprocess.PIPE, text=True)
    hidden.reveal(child.pid)
    out, _ = child.communicate(timeout=60)
    assert out.splitlines() == ["--restricted=api:key=S3CRET", "b'--restricted=api:key=<hidden>'"]


def rank(n: int) -> list[str]:
    common = ["/opt/tritonserver/bin/tritonserver", "--model-repository=/r", "--disable-auto-complete-config",
              "--backend-directory=/opt/tritonserver/backends"]
    if n == 0:
        common += ["--http-address=127.0.0.1", "--http-port=8000", "--grpc-address=127.0.0.1", "--grpc-port=8001",
                   "--metrics-address=127.0.0.1", "--metrics-port=8002", "--strict-readiness=true", "--log-verbose=0"]
    else:
        common += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
                   "--model-control-mode=explicit", "--load-model=tensorrt_llm"]
    return [*common, "--exit-on-error=true", "--exit-timeout-secs=5",
            f"--backend-config=python,shm-region-prefix-name=kit_{n}_", *SHM]


@pytest.mark.parametrize("is_root", [True, False])
def test_mpirun_argv_for_world_size_4(is_root: bool) -> None:
    config = LaunchConfig(Path("/r"), world_size=4, shm_prefix="kit_")
    expected = ["mpirun", *(["--allow-run-as-root"] if is_root else []),
                "-n", "1", *rank(0), ":", "-n", "1", *rank(1), ":", "-n", "1", *rank(2), ":", "-n", "1", *rank(3)]
    assert launch_argv(OPT, config, is_root=is_root) == expected


def fake_bin(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


def test_fake_mpirun_on_path_receives_the_argv_and_readiness_timeout_shows_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "argv.txt"
    fake_bin(tmp_path / "bin", "tritonserver", "exit 0")
    fake_bin(tmp_path / "bin", "mpirun", f'printf "%s\\n" "$@" > {record}\necho "fake mpirun: 4 ranks up"\n'
                                         "exec sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    install = locate_tritonserver()
    assert install.source == "PATH"
    config = LaunchConfig(tmp_path / "repo", free_endpoints(), world_size=4, shm_prefix=f"kit{os.getpid()}_")
    process = TritonProcess(install, config, tmp_path / "log.txt")
    process.start()
    deadline = time.monotonic() + 60  # a hang guard only: the fake has started and said so
    while "fake mpirun: 4 ranks up" not in ((tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").exists()
                                           else ""):
        assert time.monotonic() < deadline, "the fake mpirun never started"
        time.sleep(0.05)
    with pytest.raises(KitError) as info:
        process.wait_ready(timeout_s=0.5)
    assert str(info.value).startswith(f"tritonserver was not ready after 0.5 s (log {tmp_path / 'log.txt'}); last "
                                      "lines:\n")
    assert str(info.value).endswith("fake mpirun: 4 ranks up")
    assert record.read_text().splitlines() == launch_argv(install, config)[1:]
    assert not group_alive(process.pid)


def test_a_group_of_only_zombies_is_gone_and_one_that_runs_is_not() -> None:
    """A member that exited but is not collected yet (a zombie) holds nothing: stop need not wait for its parent."""
    running = subprocess.Popen(["sleep", "30"], start_new_session=True)
    exited = subprocess.Popen(["true"], start_new_session=True)
    try:
        assert group_alive(running.pid)
        deadline = time.monotonic() + 30  # a hang guard only
        while Path(f"/proc/{exited.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline, "`true` never exited"
            time.sleep(0.01)
        assert not group_alive(exited.pid)  # a zombie until waited for
    finally:
        running.kill()
        running.wait(10)
        exited.wait(10)
    assert not group_alive(running.pid) and not group_alive(exited.pid)


def test_server_dying_during_start_is_reported_with_its_log(tmp_path: Path) -> None:
    """Also: a region of the launch's prefix that a killed launch left behind (its mutex's owner is dead, and the
    Python backend would abort on it) is removed before the server starts; another prefix's region stays."""
    server = fake_bin(tmp_path / "bin", "tritonserver", 'echo "error: creating server: Internal - boom"; exit 1')
    config = LaunchConfig(tmp_path / "repo", free_endpoints(), shm_prefix=f"kit{os.getpid()}_")
    stale, other = SHM_DIR / f"{config.rank_shm_prefix(0)}tensorrt_llm_0_0", SHM_DIR / f"kit{os.getpid()}x_0_"
    stale.write_bytes(b"left by a killed launch")
    other.write_bytes(b"another launch's")
    process = TritonProcess(TritonInstall(server, "--tritonserver"), config, tmp_path / "log.txt")
    try:
        process.start()
        assert not stale.exists() and other.exists()
    finally:
        other.unlink(missing_ok=True)
    with pytest.raises(KitError, match=r"exited with code 1 while starting .*\n.*boom"):
        process.wait_ready(timeout_s=10)


HTTP2_SETTINGS = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64"  # what a gRPC server answers first


def test_a_port_taken_after_the_check_by_a_grpc_server_is_reported_as_tritonservers_bind_error(tmp_path: Path) -> None:
    """The ports are free when checked; then another server's gRPC listener takes the HTTP port before tritonserver
    binds it. The readiness probe, answered in HTTP/2 frames, reads not-ready (not an error of its own), and the
    start fails with tritonserver's own sentence."""
    config = LaunchConfig(tmp_path / "repo", free_endpoints(), shm_prefix=f"kit{os.getpid()}_")
    answered = tmp_path / "answered"
    bind_error = (f"E1130 22:26:19.477812 1 main.cc:257] \"failed to start HTTP service: Unavailable - Socket "
                  f"'127.0.0.1:{config.endpoints.http_port}' already in use \"")
    (tmp_path / "bind_error").write_text(bind_error + "\n")  # as pytriton's tritonserver prints it
    wait = f"for _ in $(seq 200); do [ -e {answered} ] && break; sleep 0.05; done"  # until the probe was answered
    server = fake_bin(tmp_path / "bin", "tritonserver", f"{wait}\ncat {tmp_path / 'bind_error'}\nexit 1")
    process = TritonProcess(TritonInstall(server, "--tritonserver"), config, tmp_path / "log.txt")
    process.start()
    with socket.create_server(("127.0.0.1", config.endpoints.http_port)) as grpc:
        def answer_in_http2() -> None:
            connection, _ = grpc.accept()
            with connection:
                connection.recv(65536)  # the probe's GET, read as a gRPC server reads its preface
                connection.sendall(HTTP2_SETTINGS)
                time.sleep(0.2)
            answered.touch()

        thread = threading.Thread(target=answer_in_http2, daemon=True)
        thread.start()
        with pytest.raises(KitError, match=r"exited with code 1 while starting: failed to start HTTP service: "
                                           r"Unavailable - Socket '127\.0\.0\.1:\d+' already in use"):
            process.wait_ready(timeout_s=10)
        thread.join(10)
    assert answered.exists()


class _AnswersReady(http.server.BaseHTTPRequestHandler):
    """Another program's server: every GET is answered 200, as another Triton answers its readiness."""

    server: _OtherServer

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.asked.set()

    def log_message(self, *args: object) -> None:
        pass


class _OtherServer(http.server.ThreadingHTTPServer):
    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _AnswersReady)
        self.asked = threading.Event()


def test_another_programs_server_answering_ready_on_the_ports_is_not_taken_for_tritonserver(tmp_path: Path) -> None:
    """The ports are free when checked; then another program's HTTP servers take the HTTP and metrics ports and
    answer the readiness probe with 200 (as another Triton would). Their listeners are not the server's, so the
    wait goes on until tritonserver fails its bind, and the start fails with tritonserver's own sentence."""
    config = LaunchConfig(tmp_path / "repo", free_endpoints(), shm_prefix=f"kit{os.getpid()}_")
    asked = tmp_path / "asked"
    bind_error = (f"E1130 22:26:19.477812 1 main.cc:257] \"failed to start HTTP service: Unavailable - Socket "
                  f"'127.0.0.1:{config.endpoints.http_port}' already in use \"")
    (tmp_path / "bind_error").write_text(bind_error + "\n")
    wait = f"for _ in $(seq 200); do [ -e {asked} ] && break; sleep 0.05; done; sleep 0.5"  # probes answered 200
    server = fake_bin(tmp_path / "bin", "tritonserver", f"{wait}\ncat {tmp_path / 'bind_error'}\nexit 1")
    process = TritonProcess(TritonInstall(server, "--tritonserver"), config, tmp_path / "log.txt")
    process.start()
    others = [_OtherServer(port) for port in (config.endpoints.http_port, config.endpoints.metrics_port)]
    for other in others:
        threading.Thread(target=other.serve_forever, daemon=True).start()

    def mark_when_both_asked() -> None:
        if all(other.asked.wait(30) for other in others):
            asked.touch()

    try:
        threading.Thread(target=mark_when_both_asked, daemon=True).start()
        with pytest.raises(KitError, match=r"exited with code 1 while starting: failed to start HTTP service: "
                                           r"Unavailable - Socket '127\.0\.0\.1:\d+' already in use"):
            process.wait_ready(timeout_s=30)
    finally:
        for other in others:
            other.shutdown()
            other.server_close()
    assert asked.exists()  # both probes were answered 200 while the wait went on


def test_a_listener_is_held_by_the_process_below_the_leader_that_opened_it() -> None:
    listener = ("import socket, sys, time; s = socket.create_server(('127.0.0.1', 0)); "
                "print(s.getsockname()[1], flush=True); time.sleep(60)")
    leader = subprocess.Popen(["bash", "-c", f'{sys.executable} -c "{listener}"; true'], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert leader.stdout is not None
        port = int(leader.stdout.readline())
        with socket.create_server(("127.0.0.1", 0)) as ours:
            assert held_by(leader.pid, port) is True  # the leader's child holds it
            assert held_by(leader.pid, ours.getsockname()[1]) is False  # this process's listener, not the leader's
            assert held_by(os.getpid(), ours.getsockname()[1]) is True
        assert held_by(leader.pid, free_port()) is None  # nothing listens there: no answer either way
    finally:
        os.killpg(leader.pid, 9)
        leader.wait(10)


def test_busy_port_is_refused_naming_the_holder() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(KitUsageError) as info:
            check_ports_free("127.0.0.1", {"gRPC": port})
    assert str(info.value) == (f"gRPC port {port} on 127.0.0.1 is in use by pid {os.getpid()} "
                               f"({__import__('psutil').Process().name()}) (Address already in use); stop that "
                               "process or choose another port with --grpc-port.")


def test_ports_must_differ() -> None:
    with pytest.raises(KitUsageError, match="must differ"):
        LaunchConfig(Path("/r"), Endpoints("127.0.0.1", 8000, 8000, 8002))


def test_out_without_a_repository(tmp_path: Path) -> None:
    from trtllm_kit.cli import run

    out = tmp_path / "o"
    assert run(["build", "builtin:tiny-llama", "--until", "checkpoint", "--no-verify", "--out", str(out)]) == 0
    with pytest.raises(KitUsageError, match=r"holds no tensorrt_llm_bls or ensemble model; rebuild with the repo"):
        servable(out)


@pytest.mark.parametrize(("pieces", "stops", "shown", "stopped", "rest"), [
    ([" w0", " w", "1"], [" w3"], [" w0", "", " w1"], False, ""),  # " w" is held until it cannot begin " w3"
    ([" w0", " w", "3 w4"], [" w3"], [" w0", "", ""], True, ""),
    (["ab", "cSTO", "Pdef"], ["STOP", "xyz"], ["ab", "c", ""], True, ""),
    (["a", "x"], ["xyz"], ["a", ""], False, "x"),
    (["hel", "lo"], [], ["hel", "lo"], False, ""),
])
def test_stop_matcher(pieces: list[str], stops: list[str], shown: list[str], stopped: bool, rest: str) -> None:
    matcher = StopMatcher(stops)
    assert [matcher.feed(p) for p in pieces] == shown
    assert (matcher.stopped, matcher.flush()) == (stopped, rest)


def test_free_ports_lie_below_the_ephemeral_range_where_no_outgoing_connection_takes_them() -> None:
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    assert all(LOWEST_FREE_PORT <= port < low for port in ports), (ports, low)
    assert len(set(ports)) > 1  # chosen at random, so two processes rarely pick the same one


def test_free_ports_do_not_follow_the_process_s_seeded_random() -> None:
    """Two processes that seed ``random`` alike (as transformers' ``set_seed`` does) must not pick the same ports:
    the choice draws nothing from the shared generator."""
    saved = random.getstate()
    try:
        random.seed(0)
        before = random.getstate()
        free_endpoints()
        assert random.getstate() == before
    finally:
        random.setstate(saved)
