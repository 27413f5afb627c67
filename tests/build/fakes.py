"""Fakes for what cannot run here: ``trtllm-build`` (a script on PATH that records its argv and writes what the
real one writes) and a GPU machine as NVML and package metadata would describe it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trtllm_kit.artifact.machine import Machine
from trtllm_kit.gpus import GPU, MIB

FAKE_TRTLLM_BUILD = textwrap.dedent('''\
    #!{python}
    """trtllm-build stand-in: record argv, then behave like a 1.2.1 build (or fail when told to)."""
    import json, os, sys
    from pathlib import Path

    argv = sys.argv[1:]
    with open(os.environ["FAKE_TRTLLM_ARGV"], "a") as log:
        log.write(json.dumps({{"argv": argv, "cwd": os.getcwd()}}) + "\\n")
    values = {{}}  # flag → its values (nargs="+" flags such as --lora_target_modules take several)
    for part in argv:
        if part.startswith("--"):
            flag = values.setdefault(part, [])
        else:
            flag.append(part)
    flags = {{name: v[0] for name, v in values.items() if len(v) == 1}}
    print("[TensorRT-LLM] TensorRT-LLM version: 1.2.1")
    if os.environ.get("FAKE_TRTLLM_FAIL"):
        for i in range(30):
            print(f"[TensorRT-LLM][INFO] building layer {{i}}", file=sys.stderr)
        print("[TensorRT-LLM][ERROR] CUDA out of memory while building rank 0", file=sys.stderr)
        sys.exit(3)
    checkpoint = json.loads((Path(flags["--checkpoint_dir"]) / "config.json").read_text())
    out = Path(flags["--output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    world = checkpoint["mapping"]["world_size"]
    names = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width")
    plugins = ("tokens_per_block", "gpt_attention_plugin", "gemm_plugin", "context_fmha", "use_paged_context_fmha",
               "use_fp8_context_fmha", "remove_input_padding", "use_fused_mlp", "reduce_fusion", "multiple_profiles",
               "gemm_swiglu_plugin")
    build = {{n: int(flags["--" + n]) for n in names}}
    build["kv_cache_type"] = flags["--kv_cache_type"].upper()
    build["plugin_config"] = {{p: flags["--" + p] for p in plugins}}
    build["plugin_config"]["tokens_per_block"] = int(flags["--tokens_per_block"])
    if "--lora_plugin" in flags:  # as trtllm-build records the LoRA support
        build["plugin_config"]["lora_plugin"] = flags["--lora_plugin"]
        build["lora_config"] = {{"lora_target_modules": values["--lora_target_modules"],
                                "max_lora_rank": int(flags["--max_lora_rank"])}}
    config = {{"version": "1.2.1", "pretrained_config": checkpoint, "build_config": build}}
    (out / "config.json").write_text(json.dumps(config, indent=4))
    for rank in range(int(os.environ.get("FAKE_TRTLLM_RANKS", world))):
        (out / f"rank{{rank}}.engine").write_bytes(b"engine rank %d " % rank + os.urandom(64))
    if "--output_timing_cache" in flags:
        Path(flags["--output_timing_cache"]).write_bytes(b"timing cache")
''')


class FakeTrtllmBuild:
    """The installed fake: its calls so far, and switches for failure and missing ranks."""

    def __init__(self, bin_dir: Path, log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin_dir, self.log, self.monkeypatch = bin_dir, log, monkeypatch

    @property
    def calls(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.is_file() else []

    def fail(self) -> None:
        self.monkeypatch.setenv("FAKE_TRTLLM_FAIL", "1")

    def write_ranks(self, count: int) -> None:
        self.monkeypatch.setenv("FAKE_TRTLLM_RANKS", str(count))


def h100_machine(num_gpus: int = 2, tensorrt_llm: str = "1.2.1") -> Machine:
    """A GPU host with TensorRT-LLM as NVML and package metadata would report it."""
    gpus = tuple(GPU("NVIDIA H100 80GB HBM3", 81559 * MIB, (9, 0), "nvml") for _ in range(num_gpus))
    return Machine(tensorrt_llm, "10.14.1.48", "13.0", "580.65.06", gpus, has_trtllm_build=True)
