"""The one layout module: torch-free, and exactly what the converter writes and the runtime reads.

The strong test converts every built-in model at several layouts and quantizations and compares each rank
file's header (names, shapes, dtypes, order) with ``rank_tensors``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import CheckpointError, KitUsageError
from trtllm_kit.layout import QuantLayout, TensorSpec, quant_entries, rank_tensors, split_name
from trtllm_kit.mapping import Mapping, kv_heads_per_rank, layers_for_rank, qkv_rows
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.models.registry import family_for
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calibrate import calibrate
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.safetensors_io import DTYPES_BY_CODE, read_header

MODELS = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-phi3"]
LAYOUTS = [(1, 1), (2, 1), (2, 2), (4, 1)]  # tp=4 > 2 KV heads: duplicated
QUANTS = {
    "none": QuantConfig(),
    "w8a16-int8kv": QuantConfig(quant="int8-wo", kv_cache="int8"),
    "w8a16": QuantConfig(quant="int8-wo"),
    "fp8-fp8kv": QuantConfig(quant="fp8", kv_cache="fp8"),
    "sq-per-tensor-int8kv": QuantConfig(quant="int8-sq", kv_cache="int8"),
    "sq-per-channel-per-token": QuantConfig(quant="int8-sq", per_channel=True, per_token=True),
    "fp8kv": QuantConfig(kv_cache="fp8"),
}
CALIBRATION = {"calib_samples": 2, "calib_seq_len": 32}


def test_importing_the_layout_does_not_import_torch() -> None:
    code = "import sys, trtllm_kit.layout; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_mapping_ranks_and_config_round_trip() -> None:
    mapping = Mapping(2, 3)
    assert list(mapping.ranks()) == [0, 1, 2, 3, 4, 5]
    assert [(mapping.tp_rank(r), mapping.pp_rank(r)) for r in mapping.ranks()] == \
        [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert all(mapping.rank(mapping.tp_rank(r), mapping.pp_rank(r)) == r for r in mapping.ranks())
    assert mapping.to_dict() == {"world_size": 6, "tp_size": 2, "pp_size": 3}
    assert Mapping.from_dict(mapping.to_dict()) == mapping
    assert Mapping.from_dict({}) == Mapping(1, 1)
    with pytest.raises(CheckpointError, match=r"c\.json has mapping\.world_size 4 but tp_size 2 × pp_size 3 = 6"):
        Mapping.from_dict({"world_size": 4, "tp_size": 2, "pp_size": 3}, "c.json")
    with pytest.raises(KitUsageError, match="tp_size must be a positive integer, got 0"):
        Mapping(0, 1)


def test_stage_and_head_arithmetic() -> None:
    assert [list(layers_for_rank(5, 2, p)) for p in range(2)] == [[0, 1, 2], [3, 4]]
    assert (kv_heads_per_rank(2, 4), kv_heads_per_rank(8, 2)) == (1, 4)
    assert qkv_rows(32, 8, 128, 16) == (2 + 2 * 1) * 128
    assert split_name("transformer.layers.12.attention.qkv.weight") == ("transformer.layers.12.", "attention.qkv",
                                                                         "weight")
    assert split_name("lm_head.weight") == ("", "", "lm_head.weight")


def test_quant_entries_per_algorithm() -> None:
    """docs/trtllm-checkpoint.md §5 by hand: FP8 scales, SmoothQuant per-tensor scales and smoother, the norm's
    scale, the KV scale."""
    dense = TensorSpec((64, 32), "float16")
    fp8 = quant_entries("transformer.layers.0.attention.dense.weight", dense, QuantLayout("FP8"))
    assert fp8 == [("transformer.layers.0.attention.dense.weight", TensorSpec((64, 32), "float8_e4m3fn")),
                   ("transformer.layers.0.attention.dense.weights_scaling_factor", TensorSpec((1,), "float32")),
                   ("transformer.layers.0.attention.dense.activation_scaling_factor", TensorSpec((1,), "float32"))]
    sq = dict(quant_entries("transformer.layers.0.attention.dense.weight", dense,
                            QuantLayout("W8A8_SQ_PER_TENSOR_PLUGIN", "INT8")))
    assert sq == {"transformer.layers.0.attention.dense.weight": TensorSpec((64, 32), "int8"),
                  "transformer.layers.0.attention.dense.per_channel_scale": TensorSpec((1, 1), "float32"),
                  "transformer.layers.0.attention.dense.act_scale": TensorSpec((1, 1), "float32"),
                  "transformer.layers.0.attention.dense.smoother": TensorSpec((1, 32), "float32"),
                  "transformer.layers.0.attention.quantization_scaling_factor": TensorSpec((1,), "float32")}
    qkv = dict(quant_entries("transformer.layers.3.attention.qkv.weight", TensorSpec((96, 64), "bfloat16"),
                             QuantLayout("W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN", "INT8")))
    assert qkv["transformer.layers.3.attention.qkv.per_channel_scale"].shape == (1, 96)  # per q/k/v part
    assert "transformer.layers.3.attention.qkv.act_scale" not in qkv  # per token: dynamic
    assert qkv["transformer.layers.3.attention.kv_cache_scaling_factor"] == TensorSpec((1,), "float32")
    norm = quant_entries("transformer.layers.3.post_layernorm.weight", TensorSpec((64,), "float16"),
                         QuantLayout("W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN"))
    assert [n for n, _ in norm] == ["transformer.layers.3.post_layernorm.weight",
                                    "transformer.layers.3.post_layernorm.scale_to_int"]
    lm_head = TensorSpec((516, 64), "float16")
    assert quant_entries("lm_head.weight", lm_head, QuantLayout("FP8", "FP8")) == [("lm_head.weight", lm_head)]


def test_parallel_embedding_shapes() -> None:
    """Checkpoints written with ``use_parallel_embedding`` split the table by padded rows or by columns."""
    hf = read_hf_config(builtin_dir("tiny-llama"))
    family, mapping = family_for(hf), Mapping(4, 1)
    split = {dim: rank_tensors(hf, family, mapping, 0, embedding_split=dim)["transformer.vocab_embedding.weight"]
             for dim in (None, 0, 1)}
    assert [split[d].shape for d in (None, 0, 1)] == [(1031, 256), (258, 256), (1031, 64)]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, object]]]:
    """Each built-in model's directory and its calibration statistics per quantization that needs them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRTLLM_KIT_CACHE", str(tmp_path_factory.mktemp("cache")))
        dirs = {name: builtin_dir(name) for name in MODELS}
    out = {}
    for name, path in dirs.items():
        stats = {}
        if name != "tiny-phi3":  # fused projections: calibrated quantization is refused (test_convert)
            needs = {(q.quant, q.kv_cache) for q in QUANTS.values() if q.needs_calibration}
            for quant, kv in needs:
                stats[(quant, kv)] = calibrate(path, QuantConfig(quant=quant, kv_cache=kv, **CALIBRATION))
        out[name] = (path, stats)
    return out


@pytest.mark.parametrize(("tp_size", "pp_size"), LAYOUTS)
@pytest.mark.parametrize("quant_name", list(QUANTS))
@pytest.mark.parametrize("name", MODELS)
def test_rank_tensors_is_what_the_converter_writes(name: str, quant_name: str, tp_size: int, pp_size: int,
                                                   calibrated: dict[str, tuple[Path, dict[str, object]]],
                                                   tmp_path: Path) -> None:
    quant = QUANTS[quant_name]
    if name == "tiny-phi3" and quant.needs_calibration:
        pytest.skip("calibrated quantization of fused projections is refused")
    if quant.quant == "int8-sq" and tp_size > 2:
        pytest.skip("SmoothQuant needs at least as many KV heads as tp")
    path, stats = calibrated[name]
    ckpt = tmp_path / "ckpt"
    result = convert_checkpoint(path, ckpt, tp_size=tp_size, pp_size=pp_size, quant=quant,
                                stats=stats.get((quant.quant, quant.kv_cache)))
    hf = read_hf_config(path)
    mapping, layout = Mapping(tp_size, pp_size), QuantLayout(quant.quant_algo, quant.kv_cache_quant_algo)
    for rank in mapping.ranks():
        want = rank_tensors(hf, family_for(hf), mapping, rank, layout, result.dtype)
        header = read_header(ckpt / f"rank{rank}.safetensors")
        written = sorted(header, key=lambda n: header[n]["data_offsets"][0])  # file order
        got = {n: TensorSpec(tuple(header[n]["shape"]), str(DTYPES_BY_CODE[header[n]["dtype"]]).removeprefix("torch."))
               for n in written}
        assert list(got) == list(want), f"rank {rank}: names or order differ"
        assert got == want, f"rank {rank}: {[n for n in want if got[n] != want[n]]}"
    model = CheckpointModel.load(ckpt)  # the runtime's checks are rank_tensors too
    assert model.forward(torch.tensor([[1, 40, 869]])).shape == (1, 3, hf.vocab_size)
