"""The private Ray's environment (``ray_settings.py``): bytecode written under the kit's cache and never beside a
source, and Ray settings that name entries of the installed Ray."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from trtllm_kit.serve.ray.ray_settings import PYCACHE, RAY_SETTINGS, ray_environment


def test_the_environment_writes_bytecode_under_the_cache_and_keeps_the_rest(tmp_path: Path) -> None:
    base = {"PATH": "/bin", "PYTHONDONTWRITEBYTECODE": "1", "RAY_USAGE_STATS_ENABLED": "1"}
    env = ray_environment(base, tmp_path / "cache")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "cache" / PYCACHE)
    assert env["PATH"] == "/bin"
    assert {name: env[name] for name in RAY_SETTINGS} == RAY_SETTINGS  # the settings win over the base's
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"


def test_a_process_of_that_environment_caches_its_bytecode_outside_the_source_tree(tmp_path: Path) -> None:
    source = tmp_path / "hashed"
    source.mkdir()
    (source / "probe.py").write_text("ANSWER = 42\n")
    env = ray_environment({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(source)}, tmp_path / "cache")
    for _ in range(2):  # the first compiles and writes, the second reads
        done = subprocess.run([sys.executable, "-c", "import probe; print(probe.ANSWER)"], env=env,
                              capture_output=True, text=True, check=True)
        assert done.stdout.strip() == "42"
    assert sorted(p.name for p in source.rglob("*")) == ["probe.py"]  # no __pycache__ beside the source
    cached = list((tmp_path / "cache" / PYCACHE).rglob("probe.*.pyc"))
    assert len(cached) == 1 and cached[0].parent.name == "hashed"


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
def test_each_ray_config_setting_names_an_entry_of_the_installed_raylet() -> None:
    raylet = Path(sysconfig.get_paths()["platlib"], "ray", "core", "src", "ray", "raylet", "raylet")
    binary = raylet.read_bytes()
    names = [name.removeprefix("RAY_") for name in RAY_SETTINGS if re.fullmatch(r"RAY_[a-z_]+", name)]
    assert len(names) == 4
    for name in names:  # RayConfig's entry, as its name or as the RAY_<name> it reads from the environment
        is_entry = b"\0" + name.encode() + b"\0" in binary or f"RAY_{name}".encode() + b"\0" in binary
        assert is_entry, f"{name} is no RayConfig entry of {raylet}"
    assert b"\0no_such_entry\0" not in binary
