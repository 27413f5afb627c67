"""One decoder layer of the kit's families (Llama, Mistral, Qwen2, Phi-3) computed over its Hugging Face weights,
operation for operation as transformers' eager code computes it: the same kernels on the same values in the same
order and dtypes, so calibration statistics equal a transformers forward bit for bit
(``tests/quant/test_layer_stream.py``) without importing transformers, whose modeling modules take seconds to import.

``unsupported`` names what a config needs that this does not compute (another family or activation, a rope type
other than default, linear and llama3, a partial rotary, per-layer attention patterns); calibration then runs
transformers' own layer class (``layer_stream.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.models.rope import inv_freq, rope_type

FAMILIES = ("llama", "mistral", "qwen2", "phi3")
ROPE_TYPES = ("default", "linear", "llama3")  # "dynamic" rounds its base at the maximum length: transformers' own
LinearHook = Callable[[str, torch.Tensor, torch.Tensor], None]  # (linear name in the layer, input, output)


def unsupported(hf: HFConfig) -> str | None:
    """Why this module cannot compute ``hf``'s layers as transformers does, or None when it can.

    Arguments:
        hf: the model config.
    """
    raw = hf.raw
    if hf.model_type not in FAMILIES:
        return f"model_type {hf.model_type}"
    if hf.hidden_act != "silu":
        return f"hidden_act {hf.hidden_act}"
    if rope_type(hf.rope_scaling) not in ROPE_TYPES:
        return f"rope type {rope_type(hf.rope_scaling)}"
    if float(raw.get("partial_rotary_factor", 1.0)) != 1.0:
        return "a partial rotary embedding"
    if raw.get("layer_types") or (hf.model_type == "qwen2" and raw.get("use_sliding_window")):
        return "attention that differs between layers"
    return None


def rotary_tables(hf: HFConfig, tokens: int, dtype: torch.dtype,
                  device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` [1, tokens, head_dim] in ``dtype`` for positions 0..tokens-1, as the model's rotary module
    returns them (float32 angles, rounded once).

    Arguments:
        hf: the model config; tokens: the window length; dtype: the compute dtype; device: a torch device.
    """
    freqs = inv_freq(hf.head_dim, hf.rope_theta, hf.rope_scaling, hf.max_position_embeddings, tokens)
    positions = torch.arange(tokens, device=device).unsqueeze(0)
    angles = positions[..., None].float() * freqs.to(device)
    table = torch.cat((angles, angles), dim=-1)
    return table.cos().to(dtype), table.sin().to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, rounded to ``x.dtype`` before the scale.

    Arguments:
        x: hidden states; weight: the scale; eps: ``rms_norm_eps``.
    """
    xf = x.to(torch.float32)
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    batch, heads, tokens, dim = x.shape
    if groups == 1:
        return x
    return x[:, :, None].expand(batch, heads, groups, tokens, dim).reshape(batch, heads * groups, tokens, dim)


@dataclass
class DecoderLayer:
    """A decoder layer's weights (names relative to the layer, in the compute dtype, on the device) and config.

    Arguments:
        hf: the model config; weights: the layer's tensors.
    """

    hf: HFConfig
    weights: dict[str, torch.Tensor]

    @property
    def linears(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """Each linear's ``(weight, bias)`` by name (``self_attn.q_proj``, ...)."""
        return {name.removesuffix(".weight"): (tensor, self.weights.get(name.removesuffix("weight") + "bias"))
                for name, tensor in self.weights.items() if name.endswith("_proj.weight")}

    def _linear(self, name: str, x: torch.Tensor, on_linear: LinearHook) -> torch.Tensor:
        y = F.linear(x, self.weights[f"{name}.weight"], self.weights.get(f"{name}.bias"))
        on_linear(name, x, y)
        return y

    def __call__(self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
                 on_linear: LinearHook) -> torch.Tensor:
        """The layer over ``hidden`` [windows, tokens, hidden].

        Arguments:
            hidden: the layer's input; rotary: ``rotary_tables``; mask: additive [1, 1, tokens, tokens];
            on_linear: called with every linear's input and output.
        """
        hf, w = self.hf, self.weights
        batch, tokens = hidden.shape[:2]
        heads_shape = (batch, tokens, -1, hf.head_dim)
        x = rms_norm(hidden, w["input_layernorm.weight"], hf.rms_norm_eps)
        if "self_attn.qkv_proj.weight" in w:  # Phi-3: q, k and v are one linear's rows
            qkv = self._linear("self_attn.qkv_proj", x, on_linear)
            q_end = hf.num_attention_heads * hf.head_dim
            k_end = q_end + hf.num_key_value_heads * hf.head_dim
            q, k, v = qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]
        else:
            q, k, v = (self._linear(f"self_attn.{p}_proj", x, on_linear) for p in "qkv")
        q, k, v = (t.view(heads_shape).transpose(1, 2) for t in (q, k, v))
        cos, sin = (t.unsqueeze(1) for t in rotary)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        groups = hf.num_attention_heads // hf.num_key_value_heads
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        scores = torch.matmul(q, k.transpose(2, 3)) * hf.head_dim ** -0.5 + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        attended = torch.matmul(probs, v).transpose(1, 2).contiguous().reshape(batch, tokens, -1).contiguous()
        hidden = hidden + self._linear("self_attn.o_proj", attended, on_linear)
        x = rms_norm(hidden, w["post_attention_layernorm.weight"], hf.rms_norm_eps)
        if "mlp.gate_up_proj.weight" in w:  # Phi-3: gate and up are one linear's halves
            gate, up = self._linear("mlp.gate_up_proj", x, on_linear).chunk(2, dim=-1)
        else:
            gate, up = self._linear("mlp.gate_proj", x, on_linear), self._linear("mlp.up_proj", x, on_linear)
        return hidden + self._linear("mlp.down_proj", F.silu(gate) * up, on_linear)
