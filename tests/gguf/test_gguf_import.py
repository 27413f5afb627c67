"""GGUF files written from the built-in tiny models with gguf's writer, in every type the issue names, imported and
built: each imported tensor equals gguf's own dequantization, an F32 file gives back the original model exactly
(weights, config, tokenizer, chat template, transformers' logits), and the build records the file's sha256."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_files import GGUF_NAMES, TYPES, interleave_rows, write_gguf
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.gguf import importer
from trtllm_kit.models.gguf.importer import IMPORT_RECORD, import_gguf
from trtllm_kit.models.gguf.weights import NAMES
from trtllm_kit.models.tokenizer import CHAT_TEMPLATE, corpus_path
from trtllm_kit.spec import build_spec

FAMILIES = ("tiny-mistral", "tiny-qwen2", "tiny-llama")  # llama layout; qwen2 biases, tied; Llama 3 RoPE scaling
SAME_CONFIG = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
               "bos_token_id", "eos_token_id", "pad_token_id")


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


def gguf_file(directory: Path, name: str, type_name: str) -> Path:
    path = directory / f"{name}-{type_name}.gguf"
    return path if path.exists() else write_gguf(builtin_dir(name), path, type_name)


def test_the_name_table_is_llama_cpps() -> None:
    kit = {k.removeprefix("blk.{}."): v for k, v in NAMES.items() if v is not None}
    test = {v: ("model.layers.{}." + k if "." in k and not k.startswith(("model.", "lm_head")) else k)
            for k, v in GGUF_NAMES.items()}
    assert kit == test


@pytest.mark.parametrize("type_name", TYPES)
def test_each_tensor_is_what_gguf_dequantizes(gguf_dir: Path, type_name: str) -> None:
    path = gguf_file(gguf_dir, "tiny-mistral", type_name)
    imported = load_file(str(import_gguf(path).model_dir / "model.safetensors"))
    config = json.loads((builtin_dir("tiny-mistral") / "config.json").read_text())
    reader = gguf.GGUFReader(str(path))
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2} == {type_name}
    for tensor in reader.tensors:
        layer, _, rest = tensor.name.removeprefix("blk.").partition(".")
        hf = next(k for k, v in GGUF_NAMES.items() if v == (rest if tensor.name.startswith("blk.") else tensor.name))
        got = imported[f"model.layers.{layer}.{hf}" if tensor.name.startswith("blk.") else hf]
        assert got.dtype == {"F16": torch.float16, "BF16": torch.bfloat16}.get(tensor.tensor_type.name, torch.float32)
        got = got.float()
        if hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in hf else "num_key_value_heads"]
            got = torch.from_numpy(interleave_rows(got.numpy(), heads))
        want = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(got.shape)
        assert torch.equal(got, torch.from_numpy(np.array(want, dtype=np.float32))), tensor.name


@pytest.mark.parametrize("name", FAMILIES)
def test_an_f32_file_gives_back_the_model(gguf_dir: Path, name: str) -> None:
    original_dir, imported_dir = builtin_dir(name), import_gguf(gguf_file(gguf_dir, name, "F32")).model_dir
    original, imported = (json.loads((d / "config.json").read_text()) for d in (original_dir, imported_dir))
    assert {k: imported[k] for k in SAME_CONFIG} == {k: original[k] for k in SAME_CONFIG}
    assert imported["architectures"] == ["Qwen2ForCausalLM" if name == "tiny-qwen2" else "LlamaForCausalLM"]
    if name == "tiny-llama":
        assert imported["rope_scaling"]["rope_type"] == "llama3"
        assert imported["rope_scaling"]["factor"] == pytest.approx(original["rope_scaling"]["factor"])
    weights = load_file(str(imported_dir / "model.safetensors"))
    assert weights.keys() == load_file(str(original_dir / "model.safetensors")).keys()
    for key, value in load_file(str(original_dir / "model.safetensors")).items():
        assert torch.equal(weights[key], value.float()), key
    ids = torch.tensor([[1, 40, 869, 133, 108, 226, 700, 5, 900, 31, 64, 120]])
    with torch.no_grad():
        want, got = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)(ids).logits
                     for d in (original_dir, imported_dir))
    assert (got - want).abs().max().item() < 1e-4


def test_the_tokenizer_and_chat_template_come_back(gguf_dir: Path) -> None:
    original = AutoTokenizer.from_pretrained(builtin_dir("tiny-qwen2"))
    imported = AutoTokenizer.from_pretrained(import_gguf(gguf_file(gguf_dir, "tiny-qwen2", "Q8_0")).model_dir)
    text = corpus_path().read_text(encoding="utf-8")[:6000] + " café cafe\u0301 ｃａｆé 2024 <|user|> </s>"
    assert imported(text).input_ids == original(text).input_ids
    files = [Tokenizer.from_file(str(Path(d) / "tokenizer.json"))
             for d in (builtin_dir("tiny-qwen2"), imported.name_or_path)]
    assert files[1].encode(text).ids == files[0].encode(text).ids  # the file itself, as serving and tokenizers read it
    assert imported.chat_template == CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, 42?"}]
    assert imported.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        original.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (imported.bos_token, imported.eos_token, imported.pad_token) == ("<s>", "</s>", "<pad>")


def test_the_import_is_cached_by_the_files_sha256(gguf_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.gguf"
    shutil.copy(gguf_file(gguf_dir, "tiny-qwen2", "Q4_0"), path)
    first = import_gguf(path)
    stamp = (first.model_dir / "model.safetensors").stat().st_mtime_ns
    with monkeypatch.context() as patch:  # an unchanged file: neither read nor hashed again
        patch.setattr(importer, "read_header", lambda *_: pytest.fail("the header was read again"))
        patch.setattr(importer, "sha256_of", lambda *_: pytest.fail("the file was hashed again"))
        again = import_gguf(path)
    assert again == first
    assert (again.model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert again.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert json.loads((first.model_dir / IMPORT_RECORD).read_text())["sha256"] == again.sha256
    os.utime(path, ns=(1, 1))  # touched, same bytes: hashed again, the same import
    assert import_gguf(path).model_dir == first.model_dir
    shutil.copy(gguf_file(gguf_dir, "tiny-qwen2", "Q4_1"), path)  # other bytes: another import
    assert import_gguf(path).model_dir != first.model_dir


@pytest.mark.parametrize("type_name", TYPES)
def test_every_type_builds_and_the_manifest_holds_the_files_sha256(gguf_dir: Path, tmp_path: Path,
                                                                   type_name: str) -> None:
    path = gguf_file(gguf_dir, "tiny-llama", type_name)
    result = run_build(build_spec({}, {"model": str(path), "out": tmp_path / "out",
                                       "build": {"until": "checkpoint", "target": "cpu"}}))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"][path.name] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert result.artifact.records.verify is not None and result.artifact.records.verify["passed"]
    assert result.artifact.records.model is not None and result.artifact.records.model.source == str(path)
