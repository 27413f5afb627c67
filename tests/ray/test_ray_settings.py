"""The private Ray's environment (``ray_settings.py``): Ray settings that name entries of the installed Ray and win
over the serve's environment."""

from __future__ import annotations

import importlib.util
import re
import sysconfig
from pathlib import Path

import pytest

from trtllm_kit.serve.ray.ray_settings import RAY_SETTINGS, ray_environment


def test_the_settings_win_over_the_base_and_the_rest_is_kept() -> None:
    env = ray_environment({"PATH": "/bin", "RAY_USAGE_STATS_ENABLED": "1"})
    assert env["PATH"] == "/bin"
    assert {name: env[name] for name in RAY_SETTINGS} == RAY_SETTINGS
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"


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
