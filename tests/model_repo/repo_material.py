"""Material for the model-repository tests: limits of both targets with fixed paths, a fake engine directory."""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_kit.artifact import EngineLimits

# The two targets with fixed paths, so that generated configs can be compared with golden files.
ENGINE_LIMITS = EngineLimits(target="engine", model_dir=Path("/models/engines"), max_batch_size=64,
                             max_num_tokens=8192, max_seq_len=4096, max_beam_width=1, tokens_per_block=32,
                             use_paged_context_fmha=True, tp_size=1, pp_size=1)
CPU_LIMITS = EngineLimits(target="cpu", model_dir=Path("/models/checkpoint"), max_batch_size=8, max_num_tokens=2048,
                          max_seq_len=1024, max_beam_width=1, tokens_per_block=32, use_paged_context_fmha=True,
                          tp_size=1, pp_size=1, rank_file_pattern="rank*.safetensors", slot_model="tensorrt_llm_cpu.py")


def write_engine_dir(path: Path, *, max_batch_size: int = 16, tp_size: int = 1, pp_size: int = 1,
                     use_paged_context_fmha: bool = True, num_rank_files: int | None = None,
                     max_lora_rank: int | None = None) -> Path:
    """What trtllm-build leaves (config.json in the TensorRT-LLM 1.x layout, empty rank files): no GPU here. With
    ``max_lora_rank``, an engine built with ``--lora_plugin auto --max_lora_rank N``."""
    path.mkdir(parents=True, exist_ok=True)
    world = tp_size * pp_size
    config = {"version": "1.2.1",
              "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "bfloat16",
                                    "mapping": {"world_size": world, "tp_size": tp_size, "pp_size": pp_size}},
              "build_config": {"max_batch_size": max_batch_size, "max_input_len": 512, "max_seq_len": 1024,
                               "max_num_tokens": 4096, "max_beam_width": 1,
                               "plugin_config": {"tokens_per_block": 32,
                                                 "use_paged_context_fmha": use_paged_context_fmha}}}
    if max_lora_rank is not None:
        config["build_config"]["plugin_config"]["lora_plugin"] = "auto"
        config["build_config"]["lora_config"] = {"max_lora_rank": max_lora_rank,
                                                 "lora_target_modules": ["attn_q", "attn_v"]}
    (path / "config.json").write_text(json.dumps(config))
    for rank in range(world if num_rank_files is None else num_rank_files):
        (path / f"rank{rank}.engine").write_bytes(b"")
    return path
