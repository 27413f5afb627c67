"""The engine target's INT4 AWQ checkpoint (``W4A16_AWQ``) against NVIDIA ModelOpt's ``INT4_AWQ_CFG`` +
``export_tensorrt_llm_checkpoint`` on the CPU, both calibrating on the same windows (ModelOpt one window per
forward pass with eager attention, as the kit's layer-streamed CPU calibration runs): the same tensor names,
dtypes and shapes, every tensor bitwise equal (int4 packed two output rows per int8, float32
``weights_scaling_factor`` per group of 128, or of 64 against ModelOpt's block size 64, ``prequant_scaling_factor``
with q/k/v sharing one, norms unchanged), at tp 1 and 2; the same ``quantization`` block. ModelOpt pads the
vocabulary of an AWQ export to a multiple of 64 with zero rows; the kit does not, so the embedding and ``lm_head``
are compared on the model's rows.
The CPU runtime runs the checkpoint by dequantizing it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.models.inspect import resolve_model_path
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.awq import int4_dequantize
from trtllm_kit.quant.calib_data import token_windows
from trtllm_kit.quant.calibrate import CalibrationStats, calibrate
from trtllm_kit.runtime.model import CheckpointModel

pytestmark = pytest.mark.slow

mtq = pytest.importorskip("modelopt.torch.quantization", reason="nvidia-modelopt is not installed (pip install "
                          "-c constraints.txt -e '.[oracle]')")
export = pytest.importorskip("modelopt.torch.export")

# The kit and ModelOpt reduce in different orders, so the AWQ search's losses tie differently at another thread
# count: the equality holds at the 2 threads these oracles were written on, whatever an earlier test set.
ORACLE_THREADS = 2


@pytest.fixture(autouse=True)
def oracle_threads() -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(ORACLE_THREADS)
    yield
    torch.set_num_threads(saved)


SAMPLES, SEQ_LEN = 4, 32
PROMPTS = ([1, 17, 305, 9, 44], [1, 600, 601, 2, 73, 73, 19, 5, 250])
NEW_TOKENS = 12
PADDED = ("lm_head.weight", "transformer.vocab_embedding.weight")


def greedy(forward, prompt: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(forward(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def modelopt_quantized(model: str, config: QuantConfig) -> torch.nn.Module:
    """The HF model as ModelOpt's INT4 AWQ quantizes it on the kit's calibration windows."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(model)
    windows = token_windows(path, config)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, attn_implementation="eager")

    def forward_loop(module: torch.nn.Module) -> None:
        with torch.no_grad():
            for window in windows:
                module(torch.tensor([window]))

    recipe = copy.deepcopy(mtq.INT4_AWQ_CFG)
    for entry in recipe["quant_cfg"]:
        if entry["quantizer_name"] == "*weight_quantizer":
            entry["cfg"]["block_sizes"][-1] = config.awq_group_size
    mtq.quantize(hf, recipe, forward_loop)
    return hf


Calibrated = tuple[CalibrationStats, torch.nn.Module]


@pytest.fixture(scope="module")
def calibrated() -> dict[tuple[str, int], Calibrated]:
    """(model, group size) -> the kit's calibration and ModelOpt's quantized model: neither depends on the tp size,
    so the tp sizes of one model and group size share them. Filled by the test that first asks, at the oracle's
    thread count (a module fixture would run before ``oracle_threads``)."""
    return {}


@pytest.mark.parametrize(("model", "tp_size", "group_size"), [
    ("builtin:tiny-llama", 1, 128), ("builtin:tiny-llama", 2, 128), ("builtin:tiny-qwen2", 1, 128),
    ("builtin:tiny-llama", 1, 64), ("builtin:tiny-llama", 2, 64)])
def test_awq_trtllm_checkpoint_matches_modelopt(model: str, tp_size: int, group_size: int, tmp_path: Path,
                                                calibrated: dict[tuple[str, int], Calibrated]) -> None:
    config = QuantConfig(quant="int4-awq", calib_samples=SAMPLES, calib_seq_len=SEQ_LEN, awq_group_size=group_size)
    if (model, group_size) not in calibrated:
        calibrated[model, group_size] = (calibrate(resolve_model_path(model), config, device="cpu"),
                                         modelopt_quantized(model, config))
    stats, quantized = calibrated[model, group_size]
    ours = tmp_path / "kit"
    convert_checkpoint(model, ours, tp_size=tp_size, dtype="bfloat16", quant=config, stats=stats)
    ref = tmp_path / "modelopt"  # the export may change the model it is given: a copy of the shared one
    export.export_tensorrt_llm_checkpoint(copy.deepcopy(quantized), "llama", torch.bfloat16, export_dir=str(ref),
                                          inference_tensor_parallel=tp_size, inference_pipeline_parallel=1)
    vocab = {name: ([], []) for name in PADDED}  # each side's vocabulary rows, rank after rank
    for rank in range(tp_size):
        with safe_open(str(ours / f"rank{rank}.safetensors"), framework="pt") as got, \
                safe_open(str(ref / f"rank{rank}.safetensors"), framework="pt") as want:
            assert sorted(got.keys()) == sorted(want.keys())
            packed = [k for k in got.keys() if got.get_tensor(k).dtype == torch.int8]  # noqa: SIM118
            assert len(packed) == 5 * 3
            for name in got.keys():  # noqa: SIM118
                mine, theirs = got.get_tensor(name), want.get_tensor(name)
                if name in PADDED:
                    vocab[name][0].append(mine)
                    vocab[name][1].append(theirs)
                    continue
                assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), name
    num_rows = json.loads((resolve_model_path(model) / "config.json").read_text())["vocab_size"]
    configs = [json.loads((side / "config.json").read_text()) for side in (ours, ref)]

    def gathered(name: str, parts: list[torch.Tensor], config: dict) -> torch.Tensor:
        is_split = name == "lm_head.weight" or config.get("use_parallel_embedding")
        return torch.cat(parts) if is_split else parts[0]

    for name, (mine_parts, their_parts) in vocab.items():
        mine, theirs = gathered(name, mine_parts, configs[0]), gathered(name, their_parts, configs[1])
        assert not mine[num_rows:].any() and not theirs[num_rows:].any(), name
        assert torch.equal(mine[:num_rows], theirs[:num_rows]), name
    quantization = json.loads((ours / "config.json").read_text())["quantization"]
    assert quantization == json.loads((ref / "config.json").read_text())["quantization"]
    assert quantization["quant_algo"] == "W4A16_AWQ" and quantization["pre_quant_scale"] is True
    assert quantization["group_size"] == group_size


@pytest.mark.parametrize("group_size", [128, 64])
def test_the_cpu_runtime_runs_an_awq_trtllm_checkpoint_token_exact(group_size: int, tmp_path: Path) -> None:
    """Against transformers holding the checkpoint's dequantized weights (times their prequant scales), each
    group of ``group_size`` input features at its own scale."""
    config = QuantConfig(quant="int4-awq", calib_samples=2, calib_seq_len=16, awq_group_size=group_size)
    stats = calibrate(resolve_model_path("builtin:tiny-llama"), config, device="cpu")
    convert_checkpoint("builtin:tiny-llama", tmp_path / "ckpt", quant=config, stats=stats)
    runtime = CheckpointModel.load(tmp_path / "ckpt")
    reference = load_causal_lm(builtin_dir("tiny-llama"), torch.float32)
    params, hf = dict(reference.named_parameters()), reference.config
    q_rows, kv_rows = hf.num_attention_heads * hf.head_dim, hf.num_key_value_heads * hf.head_dim
    with safe_open(str(tmp_path / "ckpt" / "rank0.safetensors"), framework="pt") as f:
        for layer in range(hf.num_hidden_layers):
            def weight(module: str) -> torch.Tensor:
                prefix = f"transformer.layers.{layer}.{module}"  # noqa: B023
                scales = f.get_tensor(f"{prefix}.weights_scaling_factor")
                assert scales.shape[1] * group_size == f.get_tensor(f"{prefix}.weight").shape[1]
                return int4_dequantize(f.get_tensor(f"{prefix}.weight").view(torch.uint8), scales) * \
                    f.get_tensor(f"{prefix}.prequant_scaling_factor").float()
            hf_layer = f"model.layers.{layer}"
            q, k, v = weight("attention.qkv").split([q_rows, kv_rows, kv_rows])
            for name, value in (("self_attn.q_proj", q), ("self_attn.k_proj", k), ("self_attn.v_proj", v),
                                ("self_attn.o_proj", weight("attention.dense")), ("mlp.gate_proj", weight("mlp.fc")),
                                ("mlp.up_proj", weight("mlp.gate")), ("mlp.down_proj", weight("mlp.proj"))):
                params[f"{hf_layer}.{name}.weight"].data.copy_(value)
    for prompt in PROMPTS:
        assert greedy(runtime.forward, prompt) == greedy(lambda ids: reference(ids).logits, prompt)
