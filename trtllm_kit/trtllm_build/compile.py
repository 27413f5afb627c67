"""Running ``trtllm-build`` and checking what it wrote.

The command runs in the artifact directory with relative ``checkpoint``/``engines`` paths, so the recorded
command line is the one to rerun by hand. Its stdout and stderr go to ``logs/`` in the artifact; a non-zero
exit becomes a ``KitError`` that quotes the last lines of stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError
from trtllm_kit.trtllm_build.config_file import read_engine_config
from trtllm_kit.trtllm_build.recipe import BuildCommand

STDERR_TAIL_LINES = 12
ENGINE_FILE = re.compile(r"^rank(\d+)\.engine$")


@dataclass(frozen=True)
class CompileResult:
    """What a ``trtllm-build`` run produced."""

    engine_dir: Path
    seconds: float
    engine_config: dict[str, Any]


def run_trtllm_build(command: BuildCommand, cwd: Path, log_dir: Path, world_size: int,
                     env: dict[str, str] | None = None) -> CompileResult:
    """Run the command in ``cwd``, capture its output into ``log_dir`` and validate the engine directory.

    Arguments:
        command: from ``build_command`` (paths relative to ``cwd``).
        cwd: the artifact's staging directory.
        log_dir: where ``trtllm-build.log`` and ``trtllm-build.stderr.log`` go.
        world_size: the number of rank engines expected.
        env: the environment (the current one when omitted).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = log_dir / "trtllm-build.log", log_dir / "trtllm-build.stderr.log"
    (log_dir / "trtllm-build.cmd").write_text(command.line + "\n")
    started = time.perf_counter()
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        try:
            proc = subprocess.run(command.argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                  env=env if env is not None else dict(os.environ), check=False)
        except FileNotFoundError:
            raise KitError("trtllm-build is not on PATH; install tensorrt-llm>=0.17,<1.3 or activate its "
                           "environment, or build with --target cpu.") from None
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = stderr_tail(stderr_path)
        raise KitError(f"trtllm-build exited with code {proc.returncode} after {seconds:.0f} s; the last lines of "
                       f"its stderr:\n{tail}\n(full logs were in {log_dir.name}/; rerun with: {command.line})")
    engine_dir = cwd / command.value("output_dir")
    config = validate_engine_dir(engine_dir, world_size)
    return CompileResult(engine_dir, seconds, config)


def stderr_tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    """The last non-empty lines of a log, indented for an error message."""
    text = path.read_text(errors="replace") if path.is_file() else ""
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(f"  {line}" for line in kept) or "  (stderr was empty)"


def validate_engine_dir(engine_dir: Path, world_size: int) -> dict[str, Any]:
    """Check an engine directory: ``config.json`` of the new format whose mapping matches, and exactly one
    ``rank{N}.engine`` per rank. Returns the parsed ``config.json``.

    Arguments:
        engine_dir: the directory trtllm-build wrote.
        world_size: tp × pp of the checkpoint.
    """
    config = read_engine_config(engine_dir, f"trtllm-build exited with 0 but {engine_dir.name}/config.json is "
                                "missing; the engine directory is incomplete.")
    built = config.mapping.world_size
    if built != world_size:
        raise KitError(f"{engine_dir.name}/config.json describes {built} rank(s), the checkpoint has {world_size}.")
    found = sorted(int(m.group(1)) for p in engine_dir.iterdir() if (m := ENGINE_FILE.match(p.name)))
    if found != list(range(world_size)):
        missing = sorted(set(range(world_size)) - set(found))
        extra = sorted(set(found) - set(range(world_size)))
        raise KitError(f"{engine_dir.name}/ holds rank engines {found}, expected rank0..rank{world_size - 1}.engine"
                       + (f" (missing {missing})" if missing else "") + (f" (unexpected {extra})" if extra else "")
                       + "; the build is incomplete.")
    for rank in range(world_size):
        if (engine_dir / f"rank{rank}.engine").stat().st_size == 0:
            raise KitError(f"{engine_dir.name}/rank{rank}.engine is empty; the build is incomplete.")
    return config.values


def effective_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The values the engine was really built with (read back from its ``config.json``)."""
    build = config.get("build_config") or {}
    plugins = build.get("plugin_config") or {}
    keys = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
            "kv_cache_type")
    plugin_keys = ("tokens_per_block", "gpt_attention_plugin", "gemm_plugin", "context_fmha",
                   "use_paged_context_fmha", "use_fp8_context_fmha", "remove_input_padding", "use_fused_mlp",
                   "reduce_fusion", "multiple_profiles", "gemm_swiglu_plugin")
    return {"version": config.get("version"), **{k: build.get(k) for k in keys if k in build},
            **{k: plugins.get(k) for k in plugin_keys if k in plugins}}
