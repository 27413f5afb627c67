"""``--target llmapi --quant int4-awq`` against NVIDIA ModelOpt's ``INT4_AWQ_CFG`` (``awq_lite``) +
``export_hf_checkpoint`` on every built-in family, both calibrating on the same token windows in bfloat16: the
same tensor names, dtypes and shapes, and every tensor bitwise equal (packed int4 weights, float32 group
``weight_scale``, ``pre_quant_scale``, the norms that took the shared q/k/v and gate/up scales, every other tensor);
the same ``hf_quant_config.json`` and inline ``quantization_config`` fields (producer aside).

Bitwise equality needs the same activations: ModelOpt runs here one window per forward pass with eager attention,
as the kit's layer-streamed CPU calibration does. With ModelOpt's usual 8 windows per pass (sdpa), bfloat16 rounds
the hidden states differently and a linear's searched scale can differ in the last bits (see
docs/quantization-at-scale.md for the measured difference).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from modelopt_awq import ORACLE_THREADS, modelopt_awq
from prequantized_inputs import tensors

from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import AWQ_GROUP_SIZE
from trtllm_kit.quant.algos import QuantConfig, check_target
from trtllm_kit.quant.blocks import torch_threads

pytestmark = pytest.mark.slow

if importlib.util.find_spec("modelopt") is None:  # imported where used: collection does not load ModelOpt
    pytest.skip("nvidia-modelopt is not installed (pip install -c constraints.txt -e '.[oracle]')",
                allow_module_level=True)


@pytest.fixture(autouse=True)
def at_oracle_threads() -> Iterator[None]:
    with torch_threads(ORACLE_THREADS):
        yield


FAMILIES = ("builtin:tiny-llama", "builtin:tiny-mistral", "builtin:tiny-qwen2", "builtin:tiny-phi3")
SAMPLES, SEQ_LEN = 4, 32


@pytest.mark.parametrize("model", FAMILIES)
def test_awq_export_matches_modelopt(model: str, tmp_path: Path) -> None:
    from modelopt.torch import export

    out = tmp_path / "kit"
    assert run(["build", model, "--target", "llmapi", "--quant", "int4-awq", "--calib-samples", str(SAMPLES),
                "--calib-seq-len", str(SEQ_LEN), "--until", "checkpoint", "--no-verify", "--out", str(out)]) == 0
    ours = out / "checkpoint"
    ref_dir = tmp_path / "modelopt"
    export.export_hf_checkpoint(modelopt_awq(model, AWQ_GROUP_SIZE, SAMPLES, SEQ_LEN), export_dir=str(ref_dir))
    got, want = tensors(ours), tensors(ref_dir)
    assert sorted(got) == sorted(want)
    assert {k: (t.dtype, t.shape) for k, t in got.items()} == {k: (t.dtype, t.shape) for k, t in want.items()}
    packed = [k for k, t in got.items() if t.dtype == torch.uint8]
    assert len(packed) == (4 if "phi3" in model else 7) * sum(1 for k in got if k.endswith("o_proj.weight"))
    assert all(got[f"{k.removesuffix('.weight')}.weight_scale"].dtype == torch.float32 for k in packed)
    for name in got:
        assert torch.equal(got[name], want[name]), name
    ours_q = json.loads((ours / "hf_quant_config.json").read_text())
    ref_q = json.loads((ref_dir / "hf_quant_config.json").read_text())
    assert ours_q["quantization"] == ref_q["quantization"]
    assert ref_q["quantization"]["quant_algo"] == "W4A16_AWQ" and ref_q["quantization"]["group_size"] == 128
    inline = json.loads((ours / "config.json").read_text())["quantization_config"]
    ref_inline = json.loads((ref_dir / "config.json").read_text())["quantization_config"]
    assert {k: v for k, v in inline.items() if k != "producer"} == \
        {k: v for k, v in ref_inline.items() if k != "producer"}


def test_awq_is_refused_for_the_cpu_target() -> None:
    with pytest.raises(KitUsageError) as error:
        check_target(QuantConfig(quant="int4-awq"), "cpu")
    assert str(error.value) == (
        "--quant int4-awq is exported for --target llmapi and --target engine (TensorRT-LLM's W4A16 AWQ kernels run "
        "on GPUs), not for the cpu target; build with one of those targets, or choose --quant int8-wo for the cpu "
        "target.")
