"""What the reliability tests share: the CLI as a subprocess and assertions on what a failed command leaves
behind.

Every fault here is real: files and archives are crafted on disk, full file systems are tmpfs mounts in a
private mount namespace (``unshare --mount``, root only), and builds are killed with real signals.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from kit_cli import KIT

MODEL = "builtin:tiny-llama"


def kit(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``trtllm-kit ARGS`` in a fresh interpreter (the environment's caches are the session's)."""
    return subprocess.run([*KIT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The ``Error: ...`` line a failed command printed; fails the test on a traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, done.stderr
    return lines[0].removeprefix("Error: ")


def leftovers(parent: Path) -> list[str]:
    """Hidden staging or moved-aside directories a build left in ``parent``."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".") and p.name.endswith((".partial", ".old")))


def needs_root() -> pytest.MarkDecorator:
    return pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                              reason="a private tmpfs needs root and unshare")
