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

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from modelopt_awq import ORACLE_THREADS, modelopt_awq
from safetensors import safe_open

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.models.inspect import resolve_model_path
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.awq import int4_dequantize
from trtllm_kit.quant.blocks import torch_threads
from trtllm_kit.quant.calibrate import CalibrationStats, calibrate
from trtllm_kit.runtime.model import CheckpointModel

pytestmark = pytest.mark.slow

if importlib.util.find_spec("modelopt") is None:  # imported where used: collection does not load ModelOpt
    pytest.skip("nvidia-modelopt is not installed (pip install -c constraints.txt -e '.[oracle]')",
                allow_module_level=True)


@pytest.fixture(autouse=True)
def at_oracle_threads() -> Iterator[None]:
    with torch_threads(ORACLE_THREADS):
        yield


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


@pytest.fixture(scope="module")
def calibrated() -> dict[tuple[str, int], CalibrationStats]:
    """(model, group size) -> the kit's calibration: it does not depend on the tp size, so the tp sizes of one model
    and group size share it (as they share ModelOpt's quantization, ``modelopt_awq``). Filled by the test that
    first asks, at the oracle's thread count (a module fixture would run before ``at_oracle_threads``)."""
    return {}


@pytest.mark.parametrize(("model", "tp_size", "group_size"), [
    ("builtin:tiny-llama", 1, 128), ("builtin:tiny-llama", 2, 128), ("builtin:tiny-qwen2", 1, 128),
    ("builtin:tiny-llama", 1, 64), ("builtin:tiny-llama", 2, 64)])
def test_awq_trtllm_checkpoint_matches_modelopt(model: str, tp_size: int, group_size: int, tmp_path: Path,
                                                calibrated: dict[tuple[str, int], CalibrationStats]) -> None:
    from modelopt.torch import export

    config = QuantConfig(quant="int4-awq", calib_samples=SAMPLES, calib_seq_len=SEQ_LEN, awq_group_size=group_size)
    if (model, group_size) not in calibrated:
        calibrated[model, group_size] = calibrate(resolve_model_path(model), config, device="cpu")
    ours = tmp_path / "kit"
    convert_checkpoint(model, ours, tp_size=tp_size, dtype="bfloat16", quant=config,
                       stats=calibrated[model, group_size])
    ref = tmp_path / "modelopt"
    export.export_tensorrt_llm_checkpoint(modelopt_awq(model, group_size, SAMPLES, SEQ_LEN), "llama", torch.bfloat16,
                                          export_dir=str(ref),
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
