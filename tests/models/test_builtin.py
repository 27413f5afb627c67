"""The built-in tiny models: deterministic, cached atomically, loadable by transformers, non-degenerate."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from trtllm_kit.errors import KitError, ModelError
from trtllm_kit.models import builtin
from trtllm_kit.models.builtin import BUILTIN_MODELS, builtin_dir, cache_root
from trtllm_kit.models.tokenizer import TOKENIZER_VOCAB_SIZE

NAMES = sorted(BUILTIN_MODELS)
FILES = {"config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
         "tokenizer.json", "tokenizer_config.json"}
TEXTS = ["The cat sat on the mat.", "  two spaces,\ttabs\nand\r\nnewlines  ", "It's 12:30; x = 42 * 3.0!",
         "Café à 3 °C — naïve façade, 日本語, emoji 🚀.", ""]


@pytest.fixture(scope="module", autouse=True)
def quiet_single_threaded_torch() -> Iterator[None]:
    """Tiny matrices run fastest on one thread (several threads spin when the machine is busy)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """All three models, generated once into a cache of this module's own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTLLM_KIT_CACHE", str(tmp_path_factory.mktemp("builtin-cache")))
        return {name: builtin_dir(name) for name in NAMES}


def file_hashes(model_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())}


def cache_entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "builtin").iterdir())


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("TRTLLM_KIT_CACHE")
    assert cache_root().name == "trtllm-kit"


def test_generation_is_deterministic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     model_dirs: dict[str, Path]) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))
    for name in NAMES:
        fresh = builtin_dir(name)
        assert fresh != model_dirs[name] and fresh.name == model_dirs[name].name
        assert set(file_hashes(fresh)) == FILES
        assert file_hashes(fresh) == file_hashes(model_dirs[name])


def test_cache_is_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))
    first = builtin_dir("tiny-llama")
    mtime = (first / "model.safetensors").stat().st_mtime_ns

    def must_not_run(*args: object) -> None:
        raise AssertionError("the cached model was generated again")

    monkeypatch.setattr(builtin, "write_model", must_not_run)
    assert builtin_dir("tiny-llama") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert cache_entries(tmp_path) == [first.name]


def test_a_recipe_change_changes_the_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))
    first = builtin_dir("tiny-mistral")
    monkeypatch.setattr(builtin, "GENERATOR_VERSION", builtin.GENERATOR_VERSION + 1)
    second = builtin_dir("tiny-mistral")
    assert first != second and second.name.startswith("tiny-mistral-")


def test_unknown_name_lists_the_models() -> None:
    with pytest.raises(ModelError) as info:
        builtin_dir("tiny-gpt")
    assert str(info.value) == ("there is no built-in model 'tiny-gpt'; the built-in models are "
                               "builtin:tiny-llama, builtin:tiny-mistral, builtin:tiny-qwen2, builtin:tiny-phi3, "
                               "builtin:smollm2-135m-instruct.")


def test_an_interrupted_generation_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(builtin, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        builtin_dir("tiny-qwen2")
    assert cache_entries(tmp_path) == []

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(builtin, "save_file", disk_full)
    with pytest.raises(KitError, match=r"could not write builtin:tiny-qwen2 into .*No space left on device"):
        builtin_dir("tiny-qwen2")
    assert cache_entries(tmp_path) == []

    monkeypatch.undo()
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))
    final = builtin_dir("tiny-qwen2")
    assert cache_entries(tmp_path) == [final.name]


def test_losing_the_rename_race_uses_the_winner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))
    final = tmp_path / "builtin" / f"tiny-llama-{BUILTIN_MODELS['tiny-llama'].cache_key()}"
    write_model = builtin.write_model

    def write_while_another_process_wins(model: builtin.BuiltinModel, model_dir: Path) -> None:
        write_model(model, model_dir)
        shutil.copytree(model_dir, final)
        (final / "winner").touch()

    monkeypatch.setattr(builtin, "write_model", write_while_another_process_wins)
    assert builtin_dir("tiny-llama") == final
    assert (final / "winner").exists()
    assert cache_entries(tmp_path) == [final.name]


def test_stale_temporary_directories_are_removed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))
    parent = tmp_path / "builtin"
    final_name = f"tiny-llama-{BUILTIN_MODELS['tiny-llama'].cache_key()}"
    stale, fresh = parent / f".{final_name}.old.tmp", parent / f".{final_name}.busy.tmp"
    for d in (stale, fresh):
        d.mkdir(parents=True)
    old = stale.stat().st_mtime - builtin.STALE_TMP_SECONDS - 60
    os.utime(stale, (old, old))
    builtin_dir("tiny-llama")
    assert cache_entries(tmp_path) == sorted([fresh.name, final_name])


@pytest.mark.parametrize("name", NAMES)
def test_config_matches_the_recipe(name: str, model_dirs: dict[str, Path]) -> None:
    config = json.loads((model_dirs[name] / "config.json").read_text())
    assert config == BUILTIN_MODELS[name].hf_config
    assert config["torch_dtype"] == "bfloat16"
    assert config["vocab_size"] % 2 == 1 and config["vocab_size"] >= TOKENIZER_VOCAB_SIZE
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["num_hidden_layers"]) == (256, 4, 2, 64, 3)


@pytest.mark.parametrize("name", NAMES)
def test_transformers_loads_every_tensor_and_runs(name: str, model_dirs: dict[str, Path]) -> None:
    model, info = AutoModelForCausalLM.from_pretrained(model_dirs[name], dtype="auto", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(model).__name__ == BUILTIN_MODELS[name].hf_config["architectures"][0]
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(torch.tensor([[1, 40, 869, 133, 108, 226]])).logits
    assert logits.shape == (1, 6, BUILTIN_MODELS[name].hf_config["vocab_size"])
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_logits_are_not_degenerate(name: str, model_dirs: dict[str, Path]) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dirs[name], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dirs[name])
    for prompt in ["The kettle clicked off", "Light travels at about", "Question: what is 15% of 80?"]:
        input_ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            top2 = model(input_ids).logits[0].topk(2, dim=-1).values
        assert (top2[:, 0] - top2[:, 1]).median() > 1e-2
        output_ids = model.generate(input_ids, max_new_tokens=20, do_sample=False)[0, input_ids.shape[1]:]
        longest_run = max(len(list(run)) for _, run in itertools.groupby(output_ids.tolist()))
        assert len(set(output_ids.tolist())) >= 10 and longest_run <= 5, output_ids.tolist()


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_round_trips_and_has_the_config_ids(name: str, model_dirs: dict[str, Path]) -> None:
    config = BUILTIN_MODELS[name].hf_config
    tokenizer = AutoTokenizer.from_pretrained(model_dirs[name])
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == \
        (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"])
    assert len(tokenizer) == TOKENIZER_VOCAB_SIZE <= config["vocab_size"]
    for text in TEXTS:
        ids = tokenizer(text).input_ids
        assert ids[0] == config["bos_token_id"] and max(ids) < TOKENIZER_VOCAB_SIZE
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(tokenizer("The kettle clicked off just as the rain began").input_ids) < 15  # merges learned
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<s><|user|>\nHi</s><|assistant|>\n"


@pytest.mark.parametrize("name", NAMES)
def test_ties_and_biases(name: str, model_dirs: dict[str, Path]) -> None:
    with safe_open(model_dirs[name] / "model.safetensors", "pt") as f:
        names = set(f.keys())
        dtypes = {f.get_tensor(n).dtype for n in names}
    assert dtypes == {torch.bfloat16}
    is_qwen2 = name == "tiny-qwen2"
    assert ("lm_head.weight" in names) is not is_qwen2
    biases = {n for n in names if n.endswith(".bias")}
    expected = {f"model.layers.{i}.self_attn.{p}_proj.bias" for i in range(3) for p in "qkv"}
    assert biases == (expected if is_qwen2 else set())
