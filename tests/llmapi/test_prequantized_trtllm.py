"""Pre-quantized input for the TensorRT-LLM checkpoint (``--target engine`` and ``cpu``): a ModelOpt unified FP8
checkpoint made by ModelOpt here (with an FP8 KV cache) and a compressed-tensors per-tensor FP8 one are converted
without de- and re-quantizing (the e4m3 bytes carried over; fused q/k/v and gate/up parts rescaled to the group's
largest weight scale as TensorRT-LLM's loader does), served by one tritonserver (the CPU runtime) token for token
like transformers holding the converted weights dequantized (with the same FP8 activation and KV-cache round
trips), and run the very weights the llmapi target's loader runs. A ModelOpt unified W4A16 AWQ checkpoint made by
ModelOpt here is repacked losslessly for the engine target (tp 1 and 2) and run on the CPU runtime the same way.
The inputs the TensorRT-LLM checkpoint cannot take, and a ``--quant`` that names another format, are refused in
one sentence (exit 2)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from greedy_runs import NEW_TOKENS, PROMPTS, greedy
from kit_server import ONE_EACH, KitServer
from prequantized_inputs import fp8_checkpoints, modelopt_export, with_tokenizer
from safetensors.torch import load_file, save_file
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.cli import run
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.quant.awq import int4_dequantize
from trtllm_kit.quant.fp8 import fp8_round_trip
from trtllm_kit.quant.kv import kv_round_trip
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.spec import build_spec

if importlib.util.find_spec("modelopt") is None:  # imported where used: collection does not load ModelOpt
    pytest.skip("nvidia-modelopt is not installed (pip install -c constraints.txt -e '.[oracle]')",
                allow_module_level=True)
FORMATS = {"modelopt": "ModelOpt unified FP8", "compressed": "compressed-tensors FP8 (per-tensor)"}
# TensorRT-LLM module → the HF linears it fuses (tiny-llama)
HF_LINEARS = {"attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
              "attention.dense": ("self_attn.o_proj",), "mlp.fc": ("mlp.gate_proj",), "mlp.gate": ("mlp.up_proj",),
              "mlp.proj": ("mlp.down_proj",)}
GROUP_OF = {"mlp.fc": ("mlp.gate_proj", "mlp.up_proj"), "mlp.gate": ("mlp.gate_proj", "mlp.up_proj")}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    compressed, _ = fp8_checkpoints(root)
    return {"modelopt": with_tokenizer(modelopt_export("builtin:tiny-llama", root / "modelopt")),
            "compressed": compressed}


@pytest.fixture(scope="module")
def awq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ModelOpt unified W4A16 AWQ checkpoint of the tiny Llama, made by ModelOpt."""
    out = tmp_path_factory.mktemp("awq") / "modelopt"
    return with_tokenizer(modelopt_export("builtin:tiny-llama", out, "INT4_AWQ_CFG", kv_fp8=False, samples=4,
                                          seq_len=32, per_batch=1, attention="eager"))


@pytest.fixture(scope="module")
def built(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each input as a whole --target cpu artifact (to serve) and as --target engine's checkpoint stage."""
    root = tmp_path_factory.mktemp("built")
    outs = {}
    for name, source in sources.items():
        run_build(build_spec({}, {"model": str(source), "out": root / name, "build": {"target": "cpu"},
                                  "repo": ONE_EACH}))
        assert run(["build", str(source), "--target", "engine", "--until", "checkpoint", "--out",
                    str(root / f"{name}-engine")]) == 0
        outs[name] = root / name
    return outs


@pytest.fixture(scope="module")
def served(built: dict[str, Path]) -> Any:
    """Both cpu artifacts behind one tritonserver and its OpenAI frontend (``compressed`` by that name)."""
    torch.set_num_threads(1)
    server = KitServer(built["modelopt"], more=(built["compressed"],),
                       names=(f"modelopt={built['modelopt']}", f"compressed={built['compressed']}"),
                       ready_timeout_s=180).start()
    yield server.port
    server.stop()


def served_tokens(port: int, model: str, prompt: list[int]) -> list[int]:
    """The greedy ids the OpenAI frontend streams for ``prompt`` (EOS ignored)."""
    body = {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        events = [line.removeprefix("data: ") for line in response.read().decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [i for event in events[:-1] for choice in json.loads(event)["choices"] for i in choice.get("token_ids", [])]


def fp8_kv_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, **kwargs: Any) -> Any:
    """Eager attention over keys and values read back from an FP8 cache with the layer's scale."""
    scale = module.kv_cache_scaling_factor  # type: ignore[attr-defined]
    return eager_attention_forward(module, query, kv_round_trip(key, scale, "FP8"), kv_round_trip(value, scale, "FP8"),
                                   attention_mask, **kwargs)


AttentionInterface.register("fp8_kv_eager", fp8_kv_attention)
AttentionMaskInterface.register("fp8_kv_eager", eager_mask)  # the causal mask eager attention takes


def dequantized_reference(ckpt: Path) -> torch.nn.Module:
    """transformers' tiny Llama in float32 holding the converted checkpoint's weights dequantized, each linear's
    input round-tripped through e4m3 with its ``activation_scaling_factor`` and, for an FP8 KV cache, keys and
    values through e4m3 with ``kv_cache_scaling_factor``."""
    model = load_causal_lm(builtin_dir("tiny-llama"), torch.float32)
    tensors = load_file(str(ckpt / "rank0.safetensors"))
    config = json.loads((ckpt / "config.json").read_text())
    has_fp8_kv = config["quantization"]["kv_cache_quant_algo"] == "FP8"
    for index, layer in enumerate(model.model.layers):
        prefix = f"transformer.layers.{index}"
        for module, hf_names in HF_LINEARS.items():
            weight = tensors[f"{prefix}.{module}.weight"].float() * tensors[f"{prefix}.{module}.weights_scaling_factor"]
            sizes = [layer.get_submodule(name).weight.shape[0] for name in hf_names]
            act_scale = tensors[f"{prefix}.{module}.activation_scaling_factor"]
            for name, part in zip(hf_names, torch.split(weight, sizes), strict=True):
                linear = layer.get_submodule(name)
                linear.weight.data.copy_(part)
                linear.register_forward_pre_hook(lambda _m, args, s=act_scale: (fp8_round_trip(args[0], s),))
        if has_fp8_kv:
            layer.self_attn.kv_cache_scaling_factor = tensors[f"{prefix}.attention.kv_cache_scaling_factor"]
    if has_fp8_kv:
        model.set_attn_implementation("fp8_kv_eager")
    return model


def cached_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    """transformers' own greedy decoding with its KV cache: one token per step after the prompt, as the served
    runtime decodes (with FP8 activations a full recompute of each step rounds differently at near-ties: measured
    on the compressed-tensors input's first prompt at its ninth token)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def source_tensors(source: Path) -> dict[str, torch.Tensor]:
    return load_file(str(source / "model.safetensors"))


@pytest.mark.integration
@pytest.mark.parametrize("name", list(FORMATS))
def test_converted_checkpoint_carries_the_input_over(name: str, sources: dict[str, Path],
                                                     built: dict[str, Path]) -> None:
    """Bytes carried over where a module's scale is its group's largest, rescaled parts within one e4m3 rounding
    of the input, the group's largest weight and input scales, ``max(k_scale, v_scale, 1)``; the engine target's
    checkpoint is the cpu target's; the manifest names the input."""
    ckpt = built[name] / "checkpoint"
    got, want = load_file(str(ckpt / "rank0.safetensors")), source_tensors(sources[name])
    engine_ckpt = built[name].parent / f"{name}-engine" / "checkpoint"
    assert (engine_ckpt / "rank0.safetensors").read_bytes() == (ckpt / "rank0.safetensors").read_bytes()
    num_rescaled = 0
    for index in range(json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]):
        prefix, hf = f"transformer.layers.{index}", f"model.layers.{index}"
        for module, hf_names in HF_LINEARS.items():
            group = GROUP_OF.get(module, hf_names)
            w_max = max(float(want[f"{hf}.{n}.weight_scale"]) for n in group)
            assert float(got[f"{prefix}.{module}.weights_scaling_factor"]) == w_max
            assert float(got[f"{prefix}.{module}.activation_scaling_factor"]) == \
                max(float(want[f"{hf}.{n}.input_scale"]) for n in group)
            parts = torch.split(got[f"{prefix}.{module}.weight"].view(torch.uint8),
                                [want[f"{hf}.{n}.weight"].shape[0] for n in hf_names])
            num_rescaled += any(float(want[f"{hf}.{n}.weight_scale"]) != w_max for n in hf_names)
            for hf_name, part in zip(hf_names, parts, strict=True):
                original, scale = want[f"{hf}.{hf_name}.weight"], float(want[f"{hf}.{hf_name}.weight_scale"])
                if scale == w_max:
                    assert torch.equal(part, original.view(torch.uint8)), (module, hf_name)
                else:  # one e4m3 rounding: within half a step (1/16 relative) of the input's value
                    new = part.view(torch.float8_e4m3fn).float() * w_max
                    torch.testing.assert_close(new, original.float() * scale, rtol=1 / 16, atol=w_max / 2 ** 9)
        if name == "modelopt":
            kv = max(float(want[f"{hf}.self_attn.k_proj.k_scale"]), float(want[f"{hf}.self_attn.v_proj.v_scale"]), 1.0)
            assert float(got[f"{prefix}.attention.kv_cache_scaling_factor"]) == kv
    assert num_rescaled > 0  # both producers keep a weight scale per projection
    manifest = json.loads((built[name] / "manifest.json").read_text())
    quantization = manifest["summary"]["checkpoint"]["quantization"]
    assert (quantization["input"], quantization["rescaled_modules"]) == (FORMATS[name], num_rescaled)
    assert manifest["precision"]["quant_algo"] == "FP8"
    assert manifest["precision"]["kv_cache_quant_algo"] == ("FP8" if name == "modelopt" else None)


@pytest.mark.integration
@pytest.mark.parametrize("name", list(FORMATS))
def test_served_tokens_equal_the_dequantized_reference(name: str, sources: dict[str, Path], built: dict[str, Path],
                                                       served: int) -> None:
    ckpt = built[name] / "checkpoint"
    reference = dequantized_reference(ckpt)
    converted, llmapi = CheckpointModel.load(ckpt), load_unified(sources[name])
    for prompt in PROMPTS:
        assert served_tokens(served, name, list(prompt)) == cached_greedy(reference, list(prompt))
        ids = torch.tensor([prompt])
        assert torch.equal(converted.forward(ids), llmapi.forward(ids))  # the llmapi target runs the same weights


@pytest.mark.integration
def test_tensor_parallel_split(sources: dict[str, Path], built: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "tp2"
    assert run(["build", str(sources["modelopt"]), "--target", "engine", "--tp", "2", "--until", "checkpoint",
                "--out", str(out)]) == 0
    reference = dequantized_reference(built["modelopt"] / "checkpoint")
    tp2 = CheckpointModel.load(out / "checkpoint")
    for prompt in PROMPTS:
        assert greedy(tp2.forward, prompt) == greedy(lambda ids: reference(ids).logits, prompt)


def awq_reference(ckpt: Path) -> torch.nn.Module:
    """transformers' tiny Llama in float32 holding the converted W4A16 AWQ checkpoint: each linear's weight
    dequantized (``code · weight_scale``) times its ``prequant_scaling_factor``, the norms as converted (ModelOpt
    folded q/k/v's and gate/up's AWQ scale into them)."""
    model = load_causal_lm(builtin_dir("tiny-llama"), torch.float32)
    tensors = load_file(str(ckpt / "rank0.safetensors"))
    for index, layer in enumerate(model.model.layers):
        prefix = f"transformer.layers.{index}"
        for module, hf_names in HF_LINEARS.items():
            weight = int4_dequantize(tensors[f"{prefix}.{module}.weight"].view(torch.uint8),
                                     tensors[f"{prefix}.{module}.weights_scaling_factor"]) * \
                tensors[f"{prefix}.{module}.prequant_scaling_factor"].float()
            sizes = [layer.get_submodule(name).weight.shape[0] for name in hf_names]
            for name, part in zip(hf_names, torch.split(weight, sizes), strict=True):
                layer.get_submodule(name).weight.data.copy_(part)
        layer.input_layernorm.weight.data.copy_(tensors[f"{prefix}.input_layernorm.weight"])
        layer.post_attention_layernorm.weight.data.copy_(tensors[f"{prefix}.post_layernorm.weight"])
    return model


@pytest.mark.integration
def test_awq_checkpoint_is_repacked_losslessly(awq: Path, tmp_path: Path) -> None:
    """The packed bytes and group scales as ModelOpt wrote them (split per rank at tp 2), ``pre_quant_scale`` as
    the prequant scale where the export kept it and ones where it folded it into the norm; run on the CPU runtime
    token for token like transformers on the dequantized weights, and like the llmapi target's loader."""
    want = source_tensors(awq)
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}"
        assert run(["build", str(awq), "--target", "engine", "--tp", str(tp), "--until", "checkpoint", "--out",
                    str(out)]) == 0
        ranks = [load_file(str(out / "checkpoint" / f"rank{r}.safetensors")) for r in range(tp)]
        hf = "model.layers.1"
        for module, hf_name in (("attention.dense", "self_attn.o_proj"), ("mlp.proj", "mlp.down_proj")):  # row
            got = [rank[f"transformer.layers.1.{module}.weight"].view(torch.uint8) for rank in ranks]
            assert torch.equal(torch.cat(got, dim=1), want[f"{hf}.{hf_name}.weight"])
            assert torch.equal(torch.cat([rank[f"transformer.layers.1.{module}.weights_scaling_factor"]
                                          for rank in ranks], dim=1), want[f"{hf}.{hf_name}.weight_scale"])
            assert torch.equal(torch.cat([rank[f"transformer.layers.1.{module}.prequant_scaling_factor"]
                                          for rank in ranks]), want[f"{hf}.{hf_name}.pre_quant_scale"])
        for module, hf_name in (("mlp.fc", "mlp.gate_proj"), ("mlp.gate", "mlp.up_proj")):  # column, folded
            got = [rank[f"transformer.layers.1.{module}.weight"].view(torch.uint8) for rank in ranks]
            assert torch.equal(torch.cat(got), want[f"{hf}.{hf_name}.weight"])
            assert all(torch.equal(rank[f"transformer.layers.1.{module}.prequant_scaling_factor"],
                                   torch.ones(256, dtype=torch.bfloat16)) for rank in ranks)
        assert torch.equal(ranks[0]["transformer.layers.1.post_layernorm.weight"],
                           want[f"{hf}.post_attention_layernorm.weight"])
        config = json.loads((out / "checkpoint" / "config.json").read_text())["quantization"]
        assert (config["quant_algo"], config["pre_quant_scale"], config["group_size"]) == ("W4A16_AWQ", True, 128)
    converted = CheckpointModel.load(tmp_path / "tp1" / "checkpoint")
    reference, llmapi = awq_reference(tmp_path / "tp1" / "checkpoint"), load_unified(awq)
    tp2 = CheckpointModel.load(tmp_path / "tp2" / "checkpoint")
    for prompt in PROMPTS:
        want_ids = greedy(lambda ids: reference(ids).logits, prompt)
        assert greedy(converted.forward, prompt) == want_ids == greedy(tp2.forward, prompt)
        assert torch.equal(converted.forward(torch.tensor([prompt])), llmapi.forward(torch.tensor([prompt])))


def refusal(model: Path, args: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert run(["build", str(model), *args, "--until", "checkpoint", "--out", str(out)]) == 2
    assert not out.exists()
    return capsys.readouterr().err.strip().splitlines()[-1]


def relabelled(source: Path, into: Path, algo: str) -> Path:
    """``source`` with its hf_quant_config.json declaring ``algo`` (the refusal reads the config only)."""
    shutil.copytree(source, into)
    config = json.loads((into / "hf_quant_config.json").read_text())
    config["quantization"]["quant_algo"] = algo
    (into / "hf_quant_config.json").write_text(json.dumps(config))
    return into


def test_formats_the_trtllm_checkpoint_cannot_take_are_refused(sources: dict[str, Path], awq: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    nvfp4 = relabelled(sources["modelopt"], tmp_path / "nvfp4", "NVFP4")
    for target in ("engine", "cpu"):
        assert refusal(nvfp4, ["--target", target], tmp_path / target, capsys) == (
            f"Error: {nvfp4} is a pre-quantized ModelOpt unified NVFP4 checkpoint (hf_quant_config.json); the "
            "TensorRT-LLM checkpoint of --target engine and cpu takes no NVFP4 weights (the kit exports NVFP4 for "
            "TensorRT-LLM's PyTorch backend only): build it with --target llmapi, which serves it as it is.")
    assert refusal(awq, ["--target", "cpu"], tmp_path / "awq-cpu", capsys) == (
        f"Error: {awq} is a pre-quantized ModelOpt unified W4A16_AWQ checkpoint (hf_quant_config.json); the cpu "
        "target does not take W4A16 AWQ, as it does not take --quant int4-awq (TensorRT-LLM's W4A16 AWQ kernels run "
        "on GPUs): build it with --target engine, which converts it, or with --target llmapi, which serves it as it "
        "is.")
    assert refusal(awq, ["--target", "engine", "--tp", "4"], tmp_path / "awq-tp4", capsys) == (
        f"Error: {awq} is W4A16 AWQ, whose int4 weights are split in whole bytes of two rows and groups of 128 input "
        "features, but at --tp 4 a rank's part of transformer.layers.0.attention.dense.weight is 256 x 64: choose "
        "another --tp.")


def compressed_variant(source: Path, into: Path, strategy: str, drop: str | None) -> Path:
    """``source`` declaring another weight strategy, or without its ``drop`` tensors."""
    shutil.copytree(source, into)
    config = json.loads((into / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = strategy
    (into / "config.json").write_text(json.dumps(config))
    if drop:
        tensors = {k: v for k, v in source_tensors(source).items() if not k.endswith(drop)}
        save_file(tensors, str(into / "model.safetensors"), metadata={"format": "pt"})
    return into


def test_mismatched_encodings_are_refused(sources: dict[str, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    channel = compressed_variant(sources["compressed"], tmp_path / "channel", "channel", None)
    assert refusal(channel, ["--target", "engine"], tmp_path / "o1", capsys) == (
        f"Error: {channel} is a pre-quantized compressed-tensors FP8 (per-channel) checkpoint (config.json); its "
        "per-channel weight scales with dynamic per-token activation scales are TensorRT-LLM's "
        "FP8_PER_CHANNEL_PER_TOKEN, which the kit's TensorRT-LLM checkpoint and CPU runtime do not take: build it "
        "with --target llmapi, which serves it as it is, or start from the unquantized model with --quant fp8.")
    dynamic = compressed_variant(sources["compressed"], tmp_path / "dynamic", "tensor", ".input_scale")
    assert refusal(dynamic, ["--target", "cpu"], tmp_path / "o2", capsys) == (
        f"Error: {dynamic} is a pre-quantized compressed-tensors FP8 (per-tensor) checkpoint (config.json); "
        "model.layers.0.self_attn.q_proj.input_scale is missing (dynamic activation scales), and the TensorRT-LLM "
        "FP8 checkpoint needs a static activation scale per linear: build it with --target llmapi, which serves it "
        "as it is, or start from the unquantized model with --quant fp8.")
    model = sources["modelopt"]
    assert refusal(model, ["--target", "engine", "--quant", "int8-wo"], tmp_path / "o3", capsys) == (
        f"Error: {model} is already quantized (ModelOpt unified FP8, hf_quant_config.json); --target engine and cpu "
        "convert it as it is: drop --quant int8-wo, or name the format it holds (--quant fp8 --kv-cache fp8).")
    compressed = sources["compressed"]
    assert refusal(compressed, ["--target", "cpu", "--quant", "fp8", "--kv-cache", "fp8"], tmp_path / "o4",
                   capsys) == (
        f"Error: {compressed} is already quantized (compressed-tensors FP8 (per-tensor), config.json); --target engine "
        "and cpu convert it as it is: drop --kv-cache fp8, or name the format it holds (--quant fp8).")


def test_compressed_tensors_kv_cache_scales(sources: dict[str, Path], tmp_path: Path) -> None:
    """compressed-tensors keeps ``k_scale``/``v_scale`` on the attention module: ``max(k, v, 1)`` per layer."""
    model = tmp_path / "kv"
    shutil.copytree(sources["compressed"], model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                        "dynamic": False, "symmetric": True}
    (model / "config.json").write_text(json.dumps(config))
    scales = {0: (2.5, 3.0), 1: (0.02, 0.01), 2: (4.0, 0.5)}
    tensors = source_tensors(sources["compressed"])
    for layer, (k, v) in scales.items():
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor([k])
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor([v])
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out"
    assert run(["build", str(model), "--target", "cpu", "--until", "checkpoint", "--out", str(out)]) == 0
    got = load_file(str(out / "checkpoint" / "rank0.safetensors"))
    assert [float(got[f"transformer.layers.{i}.attention.kv_cache_scaling_factor"]) for i in scales] == \
        [3.0, 1.0, 4.0]
    assert json.loads((out / "checkpoint" / "config.json").read_text())["quantization"]["kv_cache_quant_algo"] == "FP8"


def test_naming_the_format_it_holds_is_accepted(sources: dict[str, Path], built: dict[str, Path],
                                                tmp_path: Path) -> None:
    out = tmp_path / "named"
    assert run(["build", str(sources["modelopt"]), "--target", "engine", "--quant", "fp8", "--kv-cache", "fp8",
                "--until", "checkpoint", "--out", str(out)]) == 0
    assert not (out / "calibration").exists()
    assert (out / "checkpoint" / "rank0.safetensors").read_bytes() == \
        (built["modelopt"] / "checkpoint" / "rank0.safetensors").read_bytes()


def test_inspect_names_what_each_target_does(sources: dict[str, Path], awq: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(["inspect", str(sources["compressed"])]) == 0
    assert "pre-quantized: compressed-tensors FP8 (per-tensor) (config.json); --target llmapi serves it as it is, " \
           "--target engine and cpu convert it" in " ".join(capsys.readouterr().out.split())
    assert run(["inspect", str(awq)]) == 0
    assert "pre-quantized: ModelOpt unified W4A16_AWQ (hf_quant_config.json); --target llmapi serves it as it is, " \
           f"--target engine converts it; --target cpu refuses it: {awq} is a pre-quantized" in \
           " ".join(capsys.readouterr().out.split())
