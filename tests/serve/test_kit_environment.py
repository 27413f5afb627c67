"""The environment of the servers the kit starts (``kit_environment``): this interpreter first on ``PATH``, no API
key, and bytecode written under the kit's cache, never beside a source, and read again by the next process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trtllm_kit.names import API_KEY_ENV
from trtllm_kit.serve.server.group import kit_environment
from trtllm_kit.serve.server.state import PYCACHE


def test_the_environment_puts_this_interpreter_first_and_leaves_out_the_key_and_no_bytecode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path / "cache"))
    env = kit_environment({"PATH": "/bin", API_KEY_ENV: "secret", "PYTHONDONTWRITEBYTECODE": "1", "KEEP": "1"})
    assert env["PATH"].split(":") == [str(Path(sys.executable).parent), "/bin"]
    assert API_KEY_ENV not in env and "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "cache" / PYCACHE)
    assert env["KEEP"] == "1"


def test_a_process_of_that_environment_caches_its_bytecode_outside_the_source_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "hashed"
    source.mkdir()
    (source / "probe.py").write_text("ANSWER = 42\n")
    env = kit_environment({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(source)})
    for _ in range(2):  # the first compiles and writes, the second reads
        done = subprocess.run([sys.executable, "-c", "import probe; print(probe.ANSWER)"], env=env,
                              capture_output=True, text=True, check=True)
        assert done.stdout.strip() == "42"
    assert sorted(p.name for p in source.rglob("*")) == ["probe.py"]  # no __pycache__ beside the source
    cached = list((tmp_path / "cache" / PYCACHE).rglob("probe.*.pyc"))
    assert len(cached) == 1 and cached[0].parent.name == "hashed"
