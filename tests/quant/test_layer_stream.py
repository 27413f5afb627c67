"""Layer-streamed calibration: the statistics equal a whole-model transformers forward pass with hooks on every
family and in both compute dtypes (exactly: the streamed layers run the same kernels on the same values), also for
configs the kit's layer math leaves to transformers' classes; the plan states the peak memory, and a model four
times larger than the memory the process may use calibrates."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calib_data import token_windows
from trtllm_kit.quant.calib_size import CalibSize, calibration_memory
from trtllm_kit.quant.calibrate import CALIB_DTYPES, CalibrationStats, calibrate
from trtllm_kit.quant.layer_stream import LayerStream

FAMILIES = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-phi3")
ROOT = Path(__file__).parents[2]
CONFIGS = ROOT / "tests" / "data" / "hf-configs"


def whole_model_stats(path: Path, windows: list[list[int]], dtype: torch.dtype) -> CalibrationStats:
    """The reference: the whole transformers model in memory, hooks on every linear but lm_head."""
    model = load_causal_lm(path, dtype)
    stats = CalibrationStats()

    def recorder(name: str):  # type: ignore[no-untyped-def]
        def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            x = inputs[0].abs().reshape(-1, inputs[0].shape[-1]).amax(0).float()
            y = output.abs().reshape(-1, output.shape[-1]).amax(0).float()
            stats.x[name] = torch.maximum(stats.x[name], x) if name in stats.x else x
            stats.y[name] = torch.maximum(stats.y[name], y) if name in stats.y else y
        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            stats.add_weight(name, module.weight)
            module.register_forward_hook(recorder(name))
    with torch.no_grad():
        for window in windows:
            model(torch.tensor([window]))
    return stats


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name", FAMILIES)
def test_streamed_statistics_equal_the_whole_model(name: str, dtype: str) -> None:
    torch.set_num_threads(1)
    path = builtin_dir(name)
    config = QuantConfig(quant="fp8", calib_samples=4, calib_seq_len=48, calib_dtype=dtype)
    streamed = calibrate(path, config, device="cpu")
    reference = whole_model_stats(path, token_windows(path, config), CALIB_DTYPES[dtype])
    for kind in ("x", "y", "w", "wc"):
        got, want = getattr(streamed, kind), getattr(reference, kind)
        assert sorted(got) == sorted(want) and len(got) == 3 * (4 if name == "tiny-phi3" else 7)
        for module, tensor in want.items():
            assert torch.equal(got[module], tensor), (kind, module)
    assert streamed.params["dtype"] == dtype and streamed.params["calib_dtype"] == dtype


def assert_stats_equal(streamed: CalibrationStats, reference: CalibrationStats) -> None:
    for kind in ("x", "y", "w", "wc"):
        got, want = getattr(streamed, kind), getattr(reference, kind)
        assert sorted(got) == sorted(want)
        for module, tensor in want.items():
            assert torch.equal(got[module], tensor), (kind, module)


# config edits: a sliding window shorter than the windows, linear rope scaling (the kit's math), and configs it
# leaves to transformers' classes (dynamic NTK rope, per-layer attention types)
VARIANTS = {
    "mistral-window-16": ("tiny-mistral", {"sliding_window": 16}, False),
    "llama-linear-rope": ("tiny-llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, False),
    "llama-dynamic-rope": ("tiny-llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, True),
    "qwen2-layer-windows": ("tiny-qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
                            True),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_variants_equal_the_whole_model(variant: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    name, edits, by_transformers = VARIANTS[variant]
    path = tmp_path / name
    shutil.copytree(builtin_dir(name), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **edits}))
    assert LayerStream(inspect_model(str(path)), torch.bfloat16, "cpu").runs_transformers is by_transformers
    quant = QuantConfig(quant="fp8", calib_samples=4, calib_seq_len=48, calib_dtype="bfloat16")
    assert_stats_equal(calibrate(path, quant, device="cpu"),
                       whole_model_stats(path, token_windows(path, quant), torch.bfloat16))


def test_the_kit_families_calibrate_without_transformers() -> None:
    code = ("import sys, torch; from trtllm_kit.models.builtin import builtin_dir; "
            "from trtllm_kit.quant.calibrate import collect_stats; "
            "collect_stats(builtin_dir('tiny-phi3'), [[5, 6, 7, 8]], device='cpu'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert done.stdout.strip() == "[]"


def test_plan_prints_the_calibration_peak_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = CONFIGS / "meta-llama--Meta-Llama-3-70B"
    assert run(["plan", str(model), "--target", "llmapi", "--gpu", "H100-80GB", "--quant", "fp8",
                "--calib-samples", "512", "--calib-seq-len", "512", "--out", str(tmp_path / "out"), "--json"]) == 0
    calibration = json.loads(capsys.readouterr().out)["calibration"]
    # Llama-3-70B: H 8192, I 28672, 64 q / 8 KV heads of 128; bf16
    layer = 2 * (8192 * 128 * (2 * 64 + 2 * 8) + 3 * 8192 * 28672 + 2 * 8192)
    expected = layer + 2 * 512 * 512 * 8192 + 2 * 2 * 8 * 512 * 8 * 128  # one layer's KV over 8 windows
    assert (calibration["layer_bytes"], calibration["peak_bytes"], calibration["dtype"]) == \
        (layer, expected, "bfloat16")
    assert run(["plan", str(model), "--target", "llmapi", "--gpu", "H100-80GB", "--quant", "fp8", "--calib-dtype",
                "float32", "--calib-samples", "512", "--calib-seq-len", "512", "--out", str(tmp_path / "out")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (f"Calibration peak memory on {calibration['device']}: {2 * expected / 2**30:.2f} GiB, one decoder "
            f"layer at a time in float32 (layer weights {2 * layer / 2**30:.2f} + activations 8.00") in text


def test_memory_figure_parts() -> None:
    hf = read_hf_config(builtin_dir("tiny-llama"))
    memory = calibration_memory(hf, CalibSize(16, 64, "cpu", ""), "float32")
    params = 256 * 64 * (2 * 4 + 2 * 2) + 3 * 256 * 512 + 2 * 256
    assert (memory.layer_bytes, memory.activation_bytes, memory.kv_bytes) == \
        (4 * params, 4 * 16 * 64 * 256, 4 * 2 * 8 * 64 * 2 * 64)


CHILD = """
import json, resource, sys
import torch
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.quant.calibrate import collect_stats
from trtllm_kit.quant.layer_stream import read_tensor

torch.set_num_threads(1)
model_dir, cap = sys.argv[1], int(sys.argv[2])
windows = [[(7 * i + 13 * j) % 8000 for j in range(32)] for i in range(4)]
collect_stats(builtin_dir("tiny-llama"), [w[:16] for w in windows], device="cpu")  # imports, pools, allocator
vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + cap, vm + cap))
model = inspect_model(model_dir)
try:  # the cap is real: the whole model's weights do not fit under it
    held = [read_tensor(name, info) for name, info in model.tensors.items()]
    whole = "fits"
except (MemoryError, RuntimeError):
    held, whole = [], "refused"
del held
stats = collect_stats(model.path, windows, device="cpu")
print(json.dumps({"whole": whole, "modules": len(stats.x), "weight_bytes": model.weight_bytes,
                  "finite": all(bool(t.isfinite().all()) for t in stats.x.values())}))
"""


def test_a_model_four_times_the_memory_cap_calibrates(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from synthetic_checkpoint import write_checkpoint
    finally:
        sys.path.pop(0)
    cap = 90 * 2**20
    weight_bytes = write_checkpoint(tmp_path / "model", "calib-400mb", shard_gb=0.25)
    assert weight_bytes >= 4 * cap
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "model"), str(cap)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"whole": "refused", "modules": 16 * 7, "weight_bytes": weight_bytes, "finite": True}


@pytest.mark.parametrize("edit", ["drop", "reshape"])
def test_a_layer_that_does_not_match_its_config_is_refused(edit: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from trtllm_kit.errors import CheckpointError

    path = tmp_path / "model"
    shutil.copytree(builtin_dir("tiny-llama"), path)
    weights = load_file(path / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    if edit == "drop":
        del weights[name]
    else:
        weights[name] = weights[name][:-8].clone()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    quant = QuantConfig(quant="fp8", calib_samples=2, calib_seq_len=16)
    with pytest.raises(CheckpointError) as refused:
        calibrate(path, quant, device="cpu")
    shape = "no mlp.up_proj.weight" if edit == "drop" else "mlp.up_proj.weight (504, 256)"
    assert str(refused.value) == (f"layer 1 of {path} does not match its config.json ({shape}); the checkpoint is "
                                  "incomplete or of another model.")
