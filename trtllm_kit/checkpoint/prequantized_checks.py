"""What the TensorRT-LLM checkpoint of the engine and cpu targets takes from a pre-quantized input
(``quant/prequantized.py``): per-tensor FP8 with static input scales (ModelOpt unified or compressed-tensors) and,
for the engine target, ModelOpt's unified W4A16 AWQ of families with separate q/k/v and gate/up projections; every
other input is refused in one sentence naming what to do, before any heavy work (``targets/base.py``
``check_spec``), as is a ``--quant``/``--kv-cache`` that names another format than the one the input holds.
``checkpoint/prequantized.py`` converts what is taken.
"""

from __future__ import annotations

from collections.abc import Iterable

from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import LAYER_RULE_PREFIX, LINEARS, rank_tensors, split_name
from trtllm_kit.mapping import Mapping, check_tp
from trtllm_kit.models.base import Place, Rule, Slice
from trtllm_kit.models.inspect import ModelSpec
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.prequantized import PreQuantized, check_prequantized

LLMAPI = "build it with --target llmapi, which serves it as it is"
REFUSED = {  # quant_algo → why the TensorRT-LLM checkpoint cannot take it, and what to do
    "NVFP4": "the TensorRT-LLM checkpoint of --target engine and cpu takes no NVFP4 weights (the kit exports "
             f"NVFP4 for TensorRT-LLM's PyTorch backend only): {LLMAPI}.",
}
AWQ_ON_CPU = ("the cpu target does not take W4A16 AWQ, as it does not take --quant int4-awq (TensorRT-LLM's W4A16 "
              "AWQ kernels run on GPUs): build it with --target engine, which converts it, or with --target llmapi, "
              "which serves it as it is.")
AWQ_FUSED = ("{family} fuses q/k/v and gate/up in one HF projection each, whose packed int4 rows the kit does not "
             f"split: {LLMAPI}.")
PER_CHANNEL = ("its per-channel weight scales with dynamic per-token activation scales are TensorRT-LLM's "
               "FP8_PER_CHANNEL_PER_TOKEN, which the kit's TensorRT-LLM checkpoint and CPU runtime do not take: "
               f"{LLMAPI}, or start from the unquantized model with --quant fp8.")
OWN_QUANT = {"FP8": "fp8", "W4A16_AWQ": "int4-awq"}  # the --quant that names a converted format


def check_trtllm_input(fmt: PreQuantized, model: ModelSpec, quant: QuantConfig, target: str | None = None,
                       tp_size: int = 1) -> None:
    """Refuse, in one sentence, a pre-quantized input the TensorRT-LLM checkpoint cannot take as it is, or a
    ``--quant``/``--kv-cache`` that names another format than the one it holds.

    Arguments:
        fmt: the detected format; model: the inspected (headers only) model; quant: the build's quantization;
        target: the build's target (None: the checkpoint alone); tp_size: the tensor-parallel size.
    """
    problem = trtllm_input_problem(fmt, model, quant, target)
    if problem is None and fmt.quant_algo == "W4A16_AWQ":
        problem = _awq_split_problem(model, tp_size, fmt.group_size)
    if problem is not None:
        raise KitUsageError(problem)


def _awq_split_problem(model: ModelSpec, tp_size: int, group_size: int) -> str | None:
    """Why packed int4 rows and groups of ``group_size`` input features cannot be split ``tp_size`` ways, or
    None."""
    hf = model.hf
    check_tp(hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size, tp_size)
    for name, spec in rank_tensors(hf, model.family, Mapping(tp_size, 1), 0).items():
        if split_name(name)[1] in LINEARS and name.endswith(".weight") and \
                (spec.shape[0] % 2 or spec.shape[1] % group_size):
            return (f"{model.source} is W4A16 AWQ, whose int4 weights are split in whole bytes of two rows and "
                    f"groups of {group_size} input features, but at --tp {tp_size} a rank's part of {name} is "
                    f"{spec.shape[0]} x {spec.shape[1]}: choose another --tp.")
    return None


def trtllm_input_problem(fmt: PreQuantized, model: ModelSpec, quant: QuantConfig | None = None,
                         target: str | None = None) -> str | None:
    """Why ``check_trtllm_input`` refuses the input (one sentence), or None when it converts.

    Arguments:
        fmt: the detected format; model: the inspected model; quant: the build's quantization (none: not given);
        target: the build's target (None: the checkpoint alone).
    """
    quant = quant or QuantConfig()
    found = f"{model.source} is a pre-quantized {fmt.label} checkpoint ({fmt.declared_in}); "
    if fmt.quant_algo in REFUSED:
        return found + REFUSED[fmt.quant_algo]
    if fmt.strategy != "tensor":
        return found + PER_CHANNEL
    rules = model.family.rules(model.hf)
    if fmt.quant_algo == "W4A16_AWQ" and target == "cpu":
        return found + AWQ_ON_CPU
    if fmt.quant_algo == "W4A16_AWQ" and any(isinstance(source, Slice) for rule in rules for source in rule.sources):
        return found + AWQ_FUSED.format(family=model.family.name)
    own_kv = "fp8" if fmt.kv_cache_quant_algo == "FP8" else "auto"
    own = f"--quant {OWN_QUANT[fmt.quant_algo]}" + (" --kv-cache fp8" if own_kv == "fp8" else "")
    given = [f"--quant {quant.quant}"] if quant.quant not in ("none", OWN_QUANT[fmt.quant_algo]) else []
    given += [f"--kv-cache {quant.kv_cache}"] if quant.kv_cache not in ("auto", own_kv) else []
    if given:
        return (f"{model.source} is already quantized ({fmt.label}, {fmt.declared_in}); --target engine and cpu "
                f"convert it as it is: drop {' and '.join(given)}, or name the format it holds ({own}).")
    linears = [(module, name) for rule in rules if (module := layer_module(rule)) in LINEARS
               for layer in range(model.hf.num_hidden_layers) for name in rule.source_names(layer)]
    try:
        check_prequantized(fmt, model.tensors, sorted({name for _, name in linears}))
    except KitUsageError as exc:
        return str(exc)
    for module, name in linears:
        scale = f"{name.removesuffix('.weight')}.input_scale"
        if fmt.quant_algo == "FP8" and scale not in model.tensors:
            return (found + f"{scale} is missing (dynamic activation scales), and the TensorRT-LLM FP8 checkpoint "
                    f"needs a static activation scale per linear: {LLMAPI}, or start from the unquantized model "
                    "with --quant fp8.")
        if module == "attention.qkv" and fmt.kv_cache_quant_algo == "FP8":
            counts = {kind: len(names) for kind, names in kv_scale_names(model.tensors, name).items()}
            if set(counts.values()) != {1}:
                return (found + f"it declares an FP8 KV cache, but {_attention(name)} holds {counts['k_scale']} "
                        f"k_scale and {counts['v_scale']} v_scale tensor(s) where one each is needed: export it "
                        "again.")
    return None


def _attention(weight: str) -> str:
    """``model.layers.0.self_attn`` of ``model.layers.0.self_attn.q_proj.weight``."""
    return weight.rsplit(".", 2)[0]


def kv_scale_names(tensors: Iterable[str], qkv_weight: str) -> dict[str, list[str]]:
    """The ``k_scale`` and ``v_scale`` tensor names of a layer's attention (ModelOpt writes them under
    ``k_proj``/``v_proj``, compressed-tensors under the attention module).

    Arguments:
        tensors: the checkpoint's tensor names; qkv_weight: one of the layer's q/k/v weights.
    """
    attention = _attention(qkv_weight)
    return {kind: sorted(n for n in tensors if n.startswith(f"{attention}.") and n.endswith(f".{kind}"))
            for kind in ("k_scale", "v_scale")}


def layer_module(rule: Rule) -> str:
    """``attention.qkv`` for a layer rule's weight, else ""."""
    if rule.place is not Place.LAYER or not rule.name.endswith(".weight"):
        return ""
    return rule.name.removeprefix(LAYER_RULE_PREFIX).removesuffix(".weight")
