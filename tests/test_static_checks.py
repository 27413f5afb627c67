"""The static checks pass: ruff, mypy (``setup.cfg``), the import contracts (``lint-imports``), the documentation
site's strict build, and the tests' own layout (what test modules share lives in helper modules). They run in the
test command so that they share its two workers with the tests: one worker checks while the other tests, instead of
the checks holding one core while the other waits."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the longest module of its worker: handed out first
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def check(argv: list[str]) -> None:
    """Run a check from the repository root; its output is the failure's message."""
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{' '.join(argv[:3])} failed:\n{done.stdout[-6000:]}{done.stderr[-3000:]}"


def test_ruff() -> None:
    check([sys.executable, "-m", "ruff", "check", "."])


def test_mypy() -> None:
    check([sys.executable, "-m", "mypy"])


def test_import_contracts() -> None:
    check([str(BIN / "lint-imports")])


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    check([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")])


def test_test_modules_share_through_helper_modules() -> None:
    """No test module imports another test module or a ``conftest.py``: the imported one would be loaded a second time
    under another name (its module fixtures and state twice), and one module's tests would depend on another's."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names
                      if name.rsplit(".", 1)[-1].startswith("test_") or name.rsplit(".", 1)[-1] == "conftest"]
    assert found == []
