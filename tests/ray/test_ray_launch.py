"""``serve --ray`` before anything starts: its refusals, the driver's command line and imports, and the listening
socket."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit_server import TINY_BUILDS, Builds

from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.serve.ray.run import RayDirs, check_ray, driver_argv, listening_socket
from trtllm_kit.spec import ServeSettings


def _options(api_key: str | None = None, more: tuple[Path, ...] = (), aliases: tuple[str, ...] = (),
             **settings: Any) -> ServeOptions:
    return ServeOptions(out=Path("out"), settings=ServeSettings(**{"ray": True, "openai_port": 9000, **settings}),
                        api_key=api_key, more=more, aliases=aliases)


@pytest.mark.parametrize(("options", "message"), [
    (_options(openai_port=None), "--ray serves the OpenAI frontend in front of Ray Serve; add --openai-port PORT."),
    (_options(more=(Path("other"),)), "--ray serves one OUT, got 2; serve the others separately."),
    (_options(dynamo=True), "--dynamo is not available with --ray; leave it out (keys: --api-keys FILE)."),
    (_options(aliases=("chat=a:50,b:50",)),
     "--alias is not available with --ray; leave it out (keys: --api-keys FILE)."),
    (_options(api_key="k"), "--api-key is not available with --ray; leave it out (keys: --api-keys FILE)."),
    (_options(replicas="4:1"), "--replicas is 4:1; give MIN:MAX with 0 <= MIN <= MAX and MAX >= 1."),
    (_options(router="round-robin"),
     "--router round-robin is not available with --ray; give --router prefix or --router pow2."),
])
def test_what_ray_cannot_serve_is_refused_before_anything_starts(options: ServeOptions, message: str) -> None:
    with pytest.raises(KitUsageError) as caught:
        check_ray(options)
    assert str(caught.value) == message


def test_driver_runs_in_a_network_namespace_of_its_own(tmp_path: Path) -> None:
    dirs = RayDirs(tmp_path / "run" / "out-0123456789abcdef" / "ray", temp_root=tmp_path / "tmp")
    keys = tmp_path / "keys.yaml"
    argv = driver_argv(Path("/models/out"), "tiny", dirs, 7, _options(replicas="0:3", target_ongoing=2.5,
                                                                       api_keys=keys))
    assert argv == ["unshare", "--net", "--", sys.executable, "-m", "trtllm_kit.serve.ray.driver", "/models/out",
                    "--name", "tiny", "--ray-dir", str(tmp_path / "tmp" / "trtllm-kit-ray" / "0123456789abcdef"),
                    "--listen-fd", "7",
                    "--replicas", "0:3", "--target-ongoing", "2.5", "--router", "prefix", "--ready-file",
                    str(tmp_path / "run" / "out-0123456789abcdef" / "ray" / "ready"),
                    "--api-keys", str(keys)]


def test_the_port_is_bound_on_loopback_before_the_driver_starts() -> None:
    sock = listening_socket(0)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1"
        with socket.create_connection((host, port), timeout=5):  # listening: the kernel queues the connection
            pass
        with pytest.raises(KitUsageError) as caught:
            listening_socket(port)
        assert str(caught.value).startswith(f"--openai-port {port} cannot be bound on 127.0.0.1: ")
        assert str(caught.value).endswith("; pick a free port.")
    finally:
        sock.close()


def test_ray_temp_dir_is_short_enough_for_its_sockets_and_linked_from_the_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / ("deep" * 20) / "out-0123456789abcdef"
    dirs = RayDirs(run_dir / "ray", temp_root=tmp_path / "tmp")
    (run_dir / "ray" / "stale").mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    dirs.make()
    assert not (run_dir / "ray" / "stale").exists()
    assert (run_dir / "ray" / "tmp").resolve() == dirs.temp.resolve()
    assert dirs.temp.stat().st_mode & 0o777 == 0o700
    plasma = dirs.temp / "session_2026-11-29_10-01-23_518081_15539" / "sockets" / "plasma_store"
    assert len(str(plasma.relative_to(tmp_path))) + len("/tmp/") <= 107  # Ray's AF_UNIX bound, from /tmp


def test_gpu_replicas_are_refused_on_a_machine_without_gpus_and_passed_to_the_driver(
        kit_builds: Builds, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--gpu-replicas`` needs tp x pp GPUs per replica: here the serve refuses in one sentence, exit 2, before Ray
    or anything else starts; where it can run, the driver is told."""
    out = kit_builds.get(TINY_BUILDS["llmapi"])
    assert run(["serve", str(out), "--ray", "--openai-port", "9", "--gpu-replicas"]) == 2
    assert capsys.readouterr().err.strip() == (
        "Error: --gpu-replicas needs 1 GPU(s) per replica (tp 1 x pp 1) and this machine has 0 visible; run it where "
        "the GPUs are, or leave --gpu-replicas out to serve on the CPU runtime.")
    dirs = RayDirs(tmp_path / "run" / "out-0123456789abcdef" / "ray", temp_root=tmp_path / "tmp")
    assert "--gpu-replicas" in driver_argv(out, "tiny", dirs, 7, _options(gpu_replicas=True))
    assert "--gpu-replicas" not in driver_argv(out, "tiny", dirs, 7, _options())


def test_the_driver_starts_ray_without_torch() -> None:
    """The driver names the replica's class; torch (seconds to import on a loaded machine) loads in the replicas."""
    code = "import sys, trtllm_kit.serve.ray.driver; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"
