"""Where tritonserver is found, in which order, and the sentence when it is nowhere."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.server import locate
from trtllm_kit.serve.server.locate import locate_tritonserver


def fake_install(root: Path) -> Path:
    """``root/bin/tritonserver`` (executable) and ``root/backends``, the container layout."""
    (root / "bin").mkdir(parents=True)
    (root / "backends").mkdir()
    binary = root / "bin" / "tritonserver"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return binary


def test_explicit_path_wins_over_path_and_opt(tmp_path: Path) -> None:
    explicit, on_path, opt = (fake_install(tmp_path / name) for name in ("mine", "onpath", "opt"))
    found = locate_tritonserver(explicit, search_path=str(on_path.parent), opt_dir=opt.parent.parent)
    assert (found.server, found.source) == (explicit, "--tritonserver")
    assert found.backend_dir == tmp_path / "mine" / "backends"
    assert locate_tritonserver(tmp_path / "mine", search_path="").server == explicit  # an installation directory


def test_path_before_opt_before_wheel(tmp_path: Path) -> None:
    on_path, opt = fake_install(tmp_path / "onpath"), fake_install(tmp_path / "opt")
    assert locate_tritonserver(search_path=str(on_path.parent), opt_dir=tmp_path / "opt").source == "PATH"
    found = locate_tritonserver(search_path=str(tmp_path / "empty"), opt_dir=tmp_path / "opt")
    assert (found.server, found.source) == (opt, str(tmp_path / "opt"))
    wheel = locate_tritonserver(search_path=str(tmp_path / "empty"), opt_dir=tmp_path / "none", cache_dir=tmp_path)
    assert wheel.source == "nvidia-pytriton"


def test_wheel_backend_dir_holds_the_stub_of_this_python(tmp_path: Path) -> None:
    found = locate_tritonserver(search_path="", opt_dir=tmp_path / "none", cache_dir=tmp_path / "cache")
    python_dir = found.backend_dir / "python"
    stub = (python_dir / "triton_python_backend_stub").resolve()
    assert stub.parent.name == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert stub.parent.parent.name == "python_backend_stubs" and os.access(stub, os.X_OK)
    assert (python_dir / "libtriton_python.so").resolve().is_file()
    assert all(d.is_dir() for d in found.lib_dirs) and found.lib_dirs[0].name == "nvidia_pytriton.libs"
    again = locate_tritonserver(search_path="", opt_dir=tmp_path / "none", cache_dir=tmp_path / "cache")
    assert again == found  # idempotent: the symlinks are reused


def test_environment_puts_this_interpreter_first(tmp_path: Path) -> None:
    found = locate_tritonserver(search_path="", opt_dir=tmp_path / "none", cache_dir=tmp_path)
    env = found.environment({"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/lib"})
    libs = env["LD_LIBRARY_PATH"].split(":")
    assert libs == [sysconfig.get_config_var("LIBDIR"), str(found.lib_dirs[0]), "/usr/lib"]
    assert env["PATH"].split(":") == [str(Path(sys.executable).parent), "/usr/bin", "/bin"]


def test_nothing_found_names_everything_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locate, "pytriton_install", lambda cache_dir=None: None)  # as if the wheel were absent
    with pytest.raises(KitUsageError) as info:
        locate_tritonserver(search_path="/nowhere:/neither", opt_dir=tmp_path / "opt")
    assert str(info.value) == (
        f"no tritonserver found: searched --tritonserver (not given), PATH (/nowhere:/neither), "
        f"{tmp_path}/opt/bin/tritonserver and the nvidia-pytriton wheel (not installed for {sys.executable}); run "
        "inside NVIDIA's Triton container, pip install 'trtllm-kit[serve-cpu]', or pass --tritonserver PATH.")


def test_kit_cache_is_the_models_cache() -> None:
    from trtllm_kit.models.builtin import cache_root
    from trtllm_kit.serve.server.state import kit_cache

    assert kit_cache() == cache_root()


def test_explicit_path_that_is_not_a_server(tmp_path: Path) -> None:
    with pytest.raises(KitUsageError, match=r"--tritonserver .*missing is not an executable tritonserver"):
        locate_tritonserver(tmp_path / "missing")
