"""The wire is a floor of its own: it imports nothing of the kit but ``errors`` (so a Triton model file and a client
can run it anywhere the kit's core runs) and nothing heavier than numpy; torch never loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trtllm_kit.wire

WIRE = Path(trtllm_kit.wire.__file__).parent
KIT = ("trtllm_kit.errors", "trtllm_kit.wire")
TOP_LEVEL = {"numpy", "__future__", "base64", "binascii", "collections", "dataclasses", "functools", "json", "math",
             "numbers", "typing"}


def test_the_wire_imports_only_numpy_the_standard_library_and_the_kits_errors() -> None:
    for path in sorted(WIRE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] in TOP_LEVEL or name == KIT[0] or name.startswith(KIT[1]), \
                    f"{path.name} imports {name}"


def test_the_wire_runs_without_torch() -> None:
    """In a fresh interpreter where importing torch fails, every wire module imports and a request round-trips."""
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import pkgutil, importlib, trtllm_kit.wire as w\n"
        "for m in pkgutil.iter_modules(w.__path__): importlib.import_module(f'trtllm_kit.wire.{m.name}')\n"
        "from trtllm_kit.wire.trtllm import decode_trtllm_request, encode_trtllm_request\n"
        "req = w.GenerationRequest((1, 2), 3, temperature=0.5)\n"
        "assert decode_trtllm_request(encode_trtllm_request(req)) == req\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'tritonclient')))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['torch']"  # only the blocked entry itself
