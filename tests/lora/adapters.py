"""PEFT adapters made for the tests with ``peft`` itself (the reference), with random non-zero B. ``peft`` is imported
where it is used, so collecting the tests does not load it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from trtllm_kit.runtime.lora_modules import module_shapes

MAX_RANK = 16  # the --max-lora-rank the LoRA serving tests build with


def make_adapter(base_dir: Path, out: Path, *, rank: int, targets: list[str], alpha: float, seed: int) -> Path:
    """Save a LoRA adapter of ``rank`` on ``targets`` for the HF model at ``base_dir`` into ``out``.

    PEFT starts B at zero (the adapter would change nothing), so every lora_B is filled with random values.
    """
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                                  task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.5)
    peft_model.save_pretrained(out)
    return out


def peft_greedy(base_dir: Path, source: Path | None, prompt: list[int], max_tokens: int) -> list[int]:
    """The reference: ``max_tokens`` greedy tokens of the HF model at ``base_dir`` after ``prompt``, or of
    ``PeftModel`` with the adapter at ``source`` on it."""
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval()
    if source is not None:
        model = PeftModel.from_pretrained(model, source).eval()
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def one_adapter_bytes(model_dir: Path) -> int:
    """The host memory of one float32 adapter of rank MAX_RANK on every module and layer: a cache of 1 (the HF
    config has the sizes ``module_shapes`` reads)."""
    config = json.loads((model_dir / "config.json").read_text())
    per_layer = sum(fan_in + fan_out for fan_in, fan_out in module_shapes(config).values())
    return MAX_RANK * per_layer * int(config["num_hidden_layers"]) * 4
