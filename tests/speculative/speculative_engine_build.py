"""The engine target's speculative builds in tests: upstream's choice lists, ``trtllm-build`` faked on a faked H100
host (``tests/build/fakes.py``), the flags of its argv, and refusals that must come before any work."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trtllm_kit.cli import run

LIMITS = ["--max-batch-size", "4", "--max-seq-len", "128"]
# trtllm-build 1.2.1 --speculative_decoding_mode choices (tensorrt_llm/commands/build.py, "Speculative decoding
# arguments") and the tensorrt_llm model's decoding_mode values (inflight_batcher_llm/tensorrt_llm/config.pbtxt)
UPSTREAM_MODES = ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle")
UPSTREAM_DECODING_MODES = ("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle")


def _fakes() -> ModuleType:
    path = Path(__file__).parents[1] / "build" / "fakes.py"
    spec = importlib.util.spec_from_file_location("speculative_build_fakes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKES = _fakes()


def fake_gpu_host(patch: pytest.MonkeyPatch) -> Any:
    """A faked H100 host for builds and dry runs, where a build would go on to convert and compile; the machine."""
    machine = FAKES.h100_machine()
    patch.setattr("trtllm_kit.build.pipeline.detect_machine", lambda: machine)
    patch.setattr("trtllm_kit.build.dry_run.detect_machine", lambda: machine)
    return machine


def install_fake_build(root: Path, patch: pytest.MonkeyPatch) -> Any:
    """The fake ``trtllm-build`` first on PATH, recording each call's argv in ``root/argv.jsonl``, on a faked H100
    host; the machine."""
    bin_dir = root / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "trtllm-build"
    script.write_text(FAKES.FAKE_TRTLLM_BUILD.format(python=sys.executable))
    script.chmod(0o755)
    patch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    patch.setenv("FAKE_TRTLLM_ARGV", str(root / "argv.jsonl"))
    patch.delenv("FAKE_TRTLLM_FAIL", raising=False)
    patch.delenv("FAKE_TRTLLM_RANKS", raising=False)
    return fake_gpu_host(patch)


def flag_values(argv: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of an argv, by flag name without its dashes."""
    return {argv[i][2:]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")
            and not argv[i + 1].startswith("--")}


def assert_refused_before_any_work(command: list[str], mode: str, refusals: list[tuple[list[str], str]], out: Path,
                                   stderr: Callable[[], str]) -> None:
    """Each refusal's flags make ``command`` (``build``, ``plan`` or ``build --dry-run``) of tiny-llama for the
    engine target with ``--speculative mode`` fail with its message, writing nothing to ``out``.

    Arguments:
        command: the command and its options; mode: the speculative mode; refusals: (flags, message) pairs;
        out: the output directory; stderr: what was written to stderr since the last call.
    """
    for flags, message in refusals:
        assert run([command[0], "builtin:tiny-llama", *command[1:], "--out", str(out), "--target", "engine",
                    "--gpu", "H100-80GB", "--speculative", mode, *flags]) != 0, flags
        assert message in stderr()
        assert not out.exists()
