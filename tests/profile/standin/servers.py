"""Real servers on 127.0.0.1 for the harness's tests and benchmark: tritonserver (from nvidia-pytriton) with
the ``tensorrt_llm`` stand-in model, and an OpenAI-compatible SSE stand-in (``openai_standin.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from trtllm_kit.serve.server.launcher import free_port

HERE = Path(__file__).parent
INPUTS = [("input_ids", "TYPE_INT32", "-1", False), ("input_lengths", "TYPE_INT32", "1", False),
          ("request_output_len", "TYPE_INT32", "1", False)] + [
    (name, "TYPE_INT32", "1", True) for name in ("end_id", "pad_id", "min_tokens")] + [
    (name, "TYPE_BOOL", "1", True) for name in ("streaming", "exclude_input_in_output", "return_num_output_tokens",
                                                "return_perf_metrics")]
OUTPUTS = [("output_ids", "TYPE_INT32", "-1, -1"), ("sequence_length", "TYPE_INT32", "-1"),
           ("num_output_tokens", "TYPE_INT32", "1")] + [
    (name, "TYPE_INT64", "1") for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                          "last_token_time_ns")]

FIRST_TOKEN_MS = 20.0  # the pace of the stand-ins the harness tests share
TOKEN_MS = 20.0


def free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


def write_repo(root: Path, first_token_delay_ms: float = 0, token_delay_ms: float = 0,
               tokens_per_chunk: int = 1, name: str = "tensorrt_llm") -> Path:
    """A model repository with the stand-in as ``name``."""
    model = root / "repo" / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "1" / "model.py").write_text((HERE / "tensorrt_llm_model.py").read_text())
    tensors = lambda rows, kind: ",\n".join(  # noqa: E731
        f'  {{ name: "{n}" data_type: {t} dims: [ {d} ]' + (" optional: true" if kind == "in" and r[3] else "") + " }"
        for r in rows for n, t, d in [r[:3]])
    params = {"first_token_delay_ms": first_token_delay_ms, "token_delay_ms": token_delay_ms,
              "tokens_per_chunk": tokens_per_chunk}
    (model / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 64\nmodel_transaction_policy {{ decoupled: true }}\n'
        f"input [\n{tensors(INPUTS, 'in')}\n]\noutput [\n{tensors(OUTPUTS, 'out')}\n]\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + "".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items()))
    return root / "repo"


class TritonServer:
    """tritonserver from the nvidia-pytriton wheel, CPU only, bound to 127.0.0.1 on free ports."""

    def __init__(self, repo: Path, workdir: Path) -> None:
        import pytriton

        self.repo, self.workdir = repo, workdir
        self.ts = Path(pytriton.__file__).parent / "tritonserver"
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.proc: subprocess.Popen | None = None
        self.shm_prefix = f"tkitbench{os.getpid()}_{self.grpc_port}_"

    def _backends(self) -> Path:
        d = self.workdir / "backends" / "python"
        d.mkdir(parents=True, exist_ok=True)
        pyv, name_stub = f"{sys.version_info.major}.{sys.version_info.minor}", "triton_python_backend_stub"
        backend = self.ts / "backends/python"
        for name, src in [("libtriton_python.so", backend / "libtriton_python.so"),
                          ("triton_python_backend_utils.py", backend / "triton_python_backend_utils.py"),
                          ("triton_python_backend_stub", self.ts / "python_backend_stubs" / pyv / name_stub)]:
            if not (d / name).exists():
                (d / name).symlink_to(src)
        return d.parent

    @property
    def grpc_url(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def argv(self) -> list[str]:
        return [str(self.ts / "bin/tritonserver"), f"--model-repository={self.repo}", "--disable-auto-complete-config",
                f"--backend-directory={self._backends()}", "--http-address=127.0.0.1", f"--http-port={self.http_port}",
                "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}", "--metrics-address=127.0.0.1",
                f"--metrics-port={self.metrics_port}", "--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0",
                "--exit-on-error=true", "--strict-readiness=true", "--exit-timeout-secs=5",
                "--metrics-interval-ms=100",
                f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
                "--backend-config=python,shm-default-byte-size=4194304",
                "--backend-config=python,shm-growth-byte-size=1048576", "--log-verbose=0"]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        libs = [sysconfig.get_config_var("LIBDIR"), str(self.ts.parent.parent / "nvidia_pytriton.libs")]
        env["LD_LIBRARY_PATH"] = ":".join(libs + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        return env

    def start(self, argv_prefix: list[str] | None = None, extra_env: dict[str, str] | None = None,
              timeout_s: float = 60) -> TritonServer:
        log = (self.workdir / "server.log").open("w")
        self.proc = subprocess.Popen([*(argv_prefix or []), *self.argv()], env={**self.env(), **(extra_env or {})},
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}: "
                                   f"{(self.workdir / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=1), \
                        urllib.request.urlopen(self.metrics_url, timeout=1):  # Triton starts metrics last
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tritonserver not ready after {timeout_s} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for leftover in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            leftover.unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class OpenAIStandin:
    """``openai_standin.py`` in its own process: ``/v1/completions`` SSE at a fixed token pace."""

    def __init__(self, first_token_delay_ms: float = 0, token_delay_ms: float = 0) -> None:
        (self.port,) = free_ports(1)
        self.args = [f"--first-token-delay-ms={first_token_delay_ms}", f"--token-delay-ms={token_delay_ms}"]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> OpenAIStandin:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "openai_standin.py"), f"--port={self.port}",
                                      *self.args], start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("OpenAI stand-in did not start")

    def __exit__(self, *_exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
