"""GGUF files written by the tests with gguf's own writer, from the built-in tiny models, as llama.cpp lays them out:
its tensor names, q/k rows interleaved per head for llama, 1-D tensors in F32, Llama 3's RoPE scaling as a
``rope_freqs`` tensor, and the tokenizer as ``tokenizer.ggml.*`` metadata. Q4_K blocks are packed here (gguf
quantizes to Q8_0, Q4_0 and Q4_1 but not to Q4_K); what they decode to is whatever gguf's dequantize says."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from safetensors.torch import load_file

GGUF_NAMES = {  # the test's own copy of llama.cpp's names (the kit's table is checked against it)
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
SMOLLM2 = "builtin:smollm2-135m-instruct"  # the real model the tests fetch once per session (conftest.py)
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K")


def gguf_name(hf_name: str) -> str:
    if hf_name.startswith("model.layers."):
        layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
        return f"blk.{layer}.{GGUF_NAMES[rest]}"
    return GGUF_NAMES[hf_name]


def interleave_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's order of q/k rows: within each head, row i of the first half, then row i of the second."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Q4_K blocks of a float32 matrix whose rows are multiples of 256: per 256 values a float16 scale and min, 8
    sub-blocks of 32 with 6-bit scale and min indices, and 4-bit values; ``[rows, row_bytes]`` uint8."""
    rows = x.shape[0]
    sub = x.reshape(-1, 8, 32).astype(np.float32)
    low, high = np.minimum(sub.min(-1), 0), sub.max(-1)
    scale, mins = (high - low) / 15, -low
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = (mins.max(-1) / 63).astype(np.float16)
    d_safe = np.where(d == 0, 1, d).astype(np.float32)[:, None]
    dmin_safe = np.where(dmin == 0, 1, dmin).astype(np.float32)[:, None]
    sc = np.clip(np.rint(scale / d_safe), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mins / dmin_safe), 0, 63).astype(np.uint8)
    step = (d.astype(np.float32)[:, None] * sc)[..., None]
    offset = (dmin.astype(np.float32)[:, None] * m)[..., None]
    q = np.clip(np.rint((sub + offset) / np.where(step == 0, 1, step)), 0, 15).astype(np.uint8)
    packed = np.empty((sub.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # chunk c: sub-block 2c low nibbles, 2c+1 high
    blocks = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed, qs], axis=1)
    return blocks.reshape(rows, -1)


def encode(values: np.ndarray, type_name: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """A matrix's data in ``type_name`` (bytes for the quantized types, with the type to declare)."""
    if type_name == "F32":
        return values.astype(np.float32), None
    if type_name == "F16":
        return values.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "Q4_K":
        return quantize_q4_k(values), qtype
    return gguf.quants.quantize(values.astype(np.float32), qtype), qtype


def llama3_divisors(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """What llama.cpp writes as ``rope_freqs.weight`` for Llama 3's RoPE scaling."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * theta ** (i / head_dim)
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(hf_dir: Path, path: Path, type_name: str = "F32", arch: str | None = None,
               tokenizer: Callable[[gguf.GGUFWriter], None] | None = None) -> Path:
    """``hf_dir`` (a built-in tiny model) as a GGUF file at ``path``, its matrices in ``type_name``.

    Arguments:
        hf_dir: the model; path: the file to write; type_name: one of ``TYPES``; arch: override general.architecture;
        tokenizer: writes the tokenizer metadata (default: the model's own byte-level BPE).
    """
    config = json.loads((hf_dir / "config.json").read_text())
    arch = arch or ARCH[config["model_type"]]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(config["head_dim"])
    (tokenizer or (lambda w: add_tokenizer(w, hf_dir)))(writer)
    weights = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    scaling = config.get("rope_scaling")
    if scaling and scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_divisors(scaling, config["rope_theta"], config["head_dim"]))
    for name, values in weights.items():
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            values = interleave_rows(values, heads)
        if values.ndim == 1:
            writer.add_tensor(gguf_name(name), values.astype(np.float32))
        else:
            data, qtype = encode(values, type_name)
            writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_tokenizer(writer: gguf.GGUFWriter, hf_dir: Path) -> None:
    """The tiny models' byte-level BPE as llama.cpp's ``gpt2`` tokenizer with Qwen2's text splitting."""
    tokenizer = json.loads((hf_dir / "tokenizer.json").read_text())
    settings = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[settings["bos_token"]])
    writer.add_eos_token_id(vocab[settings["eos_token"]])
    writer.add_pad_token_id(vocab[settings["pad_token"]])
    writer.add_add_bos_token(True)
    writer.add_chat_template(settings["chat_template"])


def spm_vocabulary(num_learned: int) -> tuple[list[str], list[float], list[int], object]:
    """A SentencePiece-style BPE vocabulary learned on the shipped corpus, as llama.cpp stores one: ``<unk>``,
    ``<s>``, ``</s>``, the 256 byte pieces, then the learned pieces scored by merge order (earlier merges higher);
    also the trained ``tokenizers`` model itself (spaces as ``▁``), the reference for its splits."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from trtllm_kit.models.tokenizer import corpus_path

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    lines = [line for line in corpus_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    trained.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=num_learned, show_progress=False))
    state = json.loads(trained.to_str())["model"]
    rank = {"".join(m if isinstance(m, list) else m.split(" ")): i for i, m in enumerate(state["merges"])}
    learned = [t for t, _ in sorted(state["vocab"].items(), key=lambda item: item[1])]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *learned]
    scores = [0.0, 0.0, 0.0, *([0.0] * 256), *(-float(rank[t]) if t in rank else -1e6 for t in learned)]
    types = [2, 3, 3, *([6] * 256), *([1] * len(learned))]
    return tokens, scores, types, trained


def write_spm_gguf(hf_dir: Path, path: Path) -> Path:
    """``hf_dir``'s weights (F16) with a SentencePiece vocabulary (``tokenizer.ggml.model`` llama) that fills its
    embedding, as llama.cpp writes Llama 2 and Mistral files."""
    config = json.loads((hf_dir / "config.json").read_text())
    tokens, scores, types, _ = spm_vocabulary(config["vocab_size"] - 259)
    assert len(tokens) == config["vocab_size"], len(tokens)
    write_gguf(hf_dir, path, "F16", tokenizer=lambda writer: add_spm_tokenizer(writer, tokens, scores, types))
    return path


def add_spm_tokenizer(writer: gguf.GGUFWriter, tokens: list[str], scores: list[float], types: list[int]) -> None:
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)
