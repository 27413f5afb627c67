"""The CPU runtime on converted checkpoints equals transformers on tiny seeded HF models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.checkpoint.verify import LOW_PRECISION_REL_TOL, load_hf_reference
from trtllm_kit.errors import CheckpointError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.model import CheckpointModel, Rope, attend, causal_mask

# The built-in models: H=256, 4 heads, 2 KV heads (duplicated at tp=4), 3 layers ([0, 1], [2] at pp=2),
# vocab 1031 (lm_head padded to 1032 at tp=2 and 4); tiny-llama has llama3 RoPE scaling, tiny-qwen2 q/k/v
# biases and tied embeddings, tiny-mistral plain RoPE, tiny-phi3 fused qkv_proj/gate_up_proj (swiglu MLP).
VOCAB = 1031
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
SPLITS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)]
FAMILIES = ["llama", "mistral", "qwen2", "phi3"]
VARIANTS = {"linear": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
            "dynamic": {"rope_scaling": {"type": "dynamic", "factor": 2.0}, "max_position_embeddings": 16}}


def variant(source: Path, out: Path, **changes: object) -> Path:
    """A copy of an HF directory with ``config.json`` keys replaced (RoPE variants of the same weights)."""
    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **changes}))
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRTLLM_KIT_CACHE", str(tmp_path_factory.mktemp("cache")))
        dirs = {name: builtin_dir(f"tiny-{name}") for name in FAMILIES}
    root = tmp_path_factory.mktemp("variants")
    dirs.update({name: variant(dirs["llama"], root / name, **changes) for name, changes in VARIANTS.items()})
    return {name: (path, load_hf_reference(path, torch.float32, torch.float32)) for name, path in dirs.items()}


def prompt(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


def hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def convert(hf_dir: Path, out: Path, tp: int = 1, pp: int = 1, dtype: str = "float32") -> Path:
    convert_checkpoint(hf_dir, out, tp_size=tp, pp_size=pp, dtype=dtype)
    return out


@pytest.mark.parametrize("tp, pp", SPLITS)
@pytest.mark.parametrize("name", FAMILIES)
def test_fp32_logits_equal_transformers(models, tmp_path, name, tp, pp):
    hf_dir, hf = models[name]
    runtime = CheckpointModel.load(convert(hf_dir, tmp_path / "ckpt", tp, pp))
    assert runtime.rope.rope_type == hf.model.rotary_emb.rope_type == ("llama3" if name == "llama" else "default")
    ids = prompt(19)
    got = runtime.forward(ids)
    assert got.dtype == torch.float32 and got.shape == (2, 19, VOCAB)  # lm_head padding stripped
    torch.testing.assert_close(got, hf_logits(hf, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name, length, rope_type", [("linear", 19, "linear"), ("dynamic", 24, "dynamic"),
                                                     ("mistral", 19, "default")])  # dynamic: 24 > 16 positions
def test_other_variants_equal_transformers(models, tmp_path, name, length, rope_type):
    hf_dir, hf = models[name]
    runtime = CheckpointModel.load(convert(hf_dir, tmp_path / "ckpt", tp=2))
    assert runtime.rope.rope_type == hf.model.rotary_emb.rope_type == rope_type
    ids = prompt(length)
    torch.testing.assert_close(runtime.forward(ids), hf_logits(hf, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("tp, pp", [(1, 1), (4, 1), (2, 2)])
@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_logits_within_documented_tolerance(models, tmp_path, name, tp, pp):
    hf_dir = models[name][0]
    runtime = CheckpointModel.load(convert(hf_dir, tmp_path / "ckpt", tp, pp, "bfloat16"), torch.bfloat16)
    ids = prompt(33)
    want = hf_logits(load_hf_reference(hf_dir, torch.bfloat16, torch.bfloat16), ids)
    error = (runtime.forward(ids) - want).abs().max().item()
    assert error <= LOW_PRECISION_REL_TOL["bfloat16"] * want.abs().max().item()


@pytest.mark.parametrize("scaling, seq_len", [(dict(LLAMA3), 8),
                                              ({"rope_type": "linear", "factor": 4.0}, 8),
                                              ({"type": "dynamic", "factor": 2.0}, 100)])
def test_inv_freq_is_transformers_formula(scaling, seq_len):
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=64,
                         rope_theta=500000.0, rope_scaling=dict(scaling))
    want, _ = ROPE_INIT_FUNCTIONS[scaling.get("rope_type", scaling.get("type"))](config, None, seq_len=seq_len)
    rope = Rope({"rotary_base": 500000.0, "rotary_scaling": scaling, "max_position_embeddings": 64}, 64)
    assert torch.equal(rope.inv_freq(seq_len), want)


def test_kv_cached_decoding_with_the_layer_pieces_equals_forward(models, tmp_path):
    """The pieces a paged runtime will call: prefill 10 tokens, then decode 3 one at a time."""
    runtime = CheckpointModel.load(convert(models["llama"][0], tmp_path / "ckpt", tp=4))
    ids, tp = prompt(13), runtime.dims.tp_size
    cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    steps = [ids[:, :10], *ids[:, 10:].split(1, dim=1)]
    start, logits = 0, []
    for chunk in steps:
        positions = torch.arange(start, start + chunk.shape[1]).expand(2, -1)
        hidden = runtime.embed(chunk)
        for layer in range(runtime.dims.num_layers):
            x, contexts = runtime.norm(layer, "input_layernorm", hidden), []
            for r in range(tp):
                q, k, v = runtime.qkv(layer, r, x, positions, start + chunk.shape[1])
                if (layer, r) in cache:
                    k, v = (torch.cat([old, new], dim=2) for old, new in zip(cache[layer, r], (k, v), strict=True))
                cache[layer, r] = (k, v)
                contexts.append(attend(q, k, v, causal_mask(q.shape[2], k.shape[2])))
            hidden = hidden + runtime.attention_output(layer, contexts)
            hidden = hidden + runtime.mlp(layer, runtime.norm(layer, "post_layernorm", hidden))
        logits.append(runtime.logits(hidden))
        start += chunk.shape[1]
    # The same arithmetic over other row counts, which the CPU's matrix kernels sum in another order: up to 1.2e-5
    # (about 25 float32 ulps of the largest logit, 4.3) on an AVX2 machine; transformers' comparisons allow 1e-4.
    torch.testing.assert_close(torch.cat(logits, dim=1), runtime.forward(ids), atol=3e-5, rtol=0)


@pytest.fixture
def ckpt(models, tmp_path) -> Path:
    return convert(models["llama"][0], tmp_path / "ckpt", tp=2, pp=2)


def edit_config(ckpt: Path, **changes: object) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, **changes}))


def test_missing_rank_file(ckpt):
    (ckpt / "rank3.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"rank3\.safetensors is missing: the config's mapping needs 4"):
        CheckpointModel.load(ckpt)


def test_world_size_mismatch(ckpt):
    edit_config(ckpt, mapping={"world_size": 2, "tp_size": 2, "pp_size": 2})
    with pytest.raises(CheckpointError, match=r"world_size 2 but tp_size 2 × pp_size 2 = 4"):
        CheckpointModel.load(ckpt)


def test_missing_tensor_names_file_and_tensor(ckpt):
    tensors = load_file(ckpt / "rank2.safetensors")
    del tensors["transformer.layers.0.mlp.gate.weight"]
    save_file(tensors, ckpt / "rank2.safetensors")
    with pytest.raises(CheckpointError, match=r"rank2\.safetensors lacks the tensor "
                                              r"'transformer\.layers\.0\.mlp\.gate\.weight'"):
        CheckpointModel.load(ckpt)


def test_wrong_shape_is_reported(ckpt):
    tensors = load_file(ckpt / "rank3.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:-1].contiguous()
    save_file(tensors, ckpt / "rank3.safetensors")
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' has shape \[515, 256\], but config\.json "
                                              r"implies \[516, 256\]"):
        CheckpointModel.load(ckpt)


def test_replicated_tensors_must_agree_across_tp_ranks(ckpt):
    tensors = load_file(ckpt / "rank3.safetensors")
    tensors["transformer.ln_f.weight"][0] += 1
    save_file(tensors, ckpt / "rank3.safetensors")
    with pytest.raises(CheckpointError, match=r"replicated tensor 'transformer\.ln_f\.weight' differs between "
                                              r"rank2\.safetensors and rank3\.safetensors"):
        CheckpointModel.load(ckpt)


@pytest.mark.parametrize("changes, message", [
    ({"rotary_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rotary_scaling of type 'yarn', which the CPU"),
    ({"quantization": {"quant_algo": "W4A8_AWQ", "kv_cache_quant_algo": None}}, "is quantized with W4A8_AWQ"),
    ({"architecture": "GPT2LMHeadModel"}, "architecture 'GPT2LMHeadModel'"),
    ({"hidden_act": "swiglu"}, "has hidden_act 'swiglu'; the CPU runtime needs 'silu'"),  # Llama: GatedMLP
    ({"architecture": "Phi3ForCausalLM"}, "has hidden_act 'silu'; the CPU runtime needs 'swiglu'"),
    ({"rotary_pct": 0.5}, "has rotary_pct 0.5; the CPU runtime needs 1.0"),
])
def test_unsupported_configs(ckpt, changes, message):
    edit_config(ckpt, **changes)
    with pytest.raises(CheckpointError, match=message):
        CheckpointModel.load(ckpt)
