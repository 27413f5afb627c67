"""Every script in ``benchmarks/`` imports: the package modules and names it uses exist (a benchmark that names a
moved module fails here, not on the day someone runs it). One interpreter imports them all, without running any."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
IMPORT_ALL = """
import importlib.util, sys, traceback
failed = []
for path in sys.argv[1:]:
    name = "benchmark_" + path.rsplit("/", 1)[-1][:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        failed.append(path + ": " + traceback.format_exc(limit=1).strip().splitlines()[-1])
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_benchmark_script_imports() -> None:
    scripts = sorted(str(p) for p in BENCHMARKS.glob("*.py"))
    assert len(scripts) > 20
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *scripts], capture_output=True, text=True,
                          cwd=BENCHMARKS, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
