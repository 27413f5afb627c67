"""Write a synthetic Llama-shaped Hugging Face checkpoint (random weights) for benchmarks.

    python scripts/synthetic_checkpoint.py /tmp/tinyllama-synthetic --preset tinyllama-1.1b

The layout is what ``save_pretrained`` produces: config.json, model-0000N-of-0000M.safetensors shards of
about ``--shard-gb`` each and model.safetensors.index.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

PRESETS = {
    # TinyLlama/TinyLlama-1.1B-Chat-v1.0 dimensions (shared/data/hf-configs)
    "tinyllama-1.1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                       "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000},
    "calib-400mb": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 16,
                    "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 8000},
    "small": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8000},
}


def llama_shapes(c: dict[str, int]) -> dict[str, tuple[int, ...]]:
    h, i, d = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab_size"], h)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        shapes |= {f"{p}.input_layernorm.weight": (h,), f"{p}.self_attn.q_proj.weight": (h, h),
                   f"{p}.self_attn.k_proj.weight": (kv, h), f"{p}.self_attn.v_proj.weight": (kv, h),
                   f"{p}.self_attn.o_proj.weight": (h, h), f"{p}.post_attention_layernorm.weight": (h,),
                   f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h),
                   f"{p}.mlp.down_proj.weight": (h, i)}
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (c["vocab_size"], h)}
    return shapes


def write_checkpoint(out: Path, preset: str = "tinyllama-1.1b", shard_gb: float = 1.0, seed: int = 0) -> int:
    """Write the checkpoint and return its weight bytes.

    Arguments:
        out: directory to create.
        preset: a key of ``PRESETS``.
        shard_gb: target size of each safetensors shard.
        seed: random seed.
    """
    dims = PRESETS[preset]
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    shapes = llama_shapes(dims)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size, total = 0, 0
    for name, shape in shapes.items():
        tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        nbytes = tensor.numel() * 2
        if size and size + nbytes > shard_gb * 1e9:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
        total += nbytes
    weight_map = {}
    for index, tensors in enumerate(shards, start=1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map |= {name: file for name in tensors}
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
              **dims}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tinyllama-1.1b")
    parser.add_argument("--shard-gb", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    total = write_checkpoint(args.out, args.preset, args.shard_gb, args.seed)
    print(f"wrote {args.out}: {total / 1e9:.2f} GB of bfloat16 weights")


if __name__ == "__main__":
    main()
