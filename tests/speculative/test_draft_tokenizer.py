"""A draft's tokenizer is compared with the target's by vocabulary and special tokens, not by file names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.spec.draft_tokenizer import check_draft_tokenizer, tokenizer_identity


def copy_of(name: str, to: Path) -> Path:
    shutil.copytree(builtin_dir(name), to)
    for path in to.iterdir():
        path.chmod(0o644)
    return to


def test_two_models_with_the_same_tokenizer_pass() -> None:
    check_draft_tokenizer(builtin_dir("tiny-llama"), builtin_dir("tiny-qwen2"))


def test_a_vocabulary_with_two_ids_swapped_is_refused(tmp_path: Path) -> None:
    draft = copy_of("tiny-llama", tmp_path / "draft")
    tokenizer = json.loads((draft / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])][-2:]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (draft / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(KitUsageError) as error:
        check_draft_tokenizer(builtin_dir("tiny-llama"), draft)
    assert f"(2 tokens have another id or none, e.g. {min(first, second)!r})" in str(error.value)
    assert str(error.value).endswith("use a draft with the target's tokenizer.")


def test_another_eos_token_is_refused(tmp_path: Path) -> None:
    draft = copy_of("tiny-llama", tmp_path / "draft")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        values = json.loads((draft / name).read_text())
        values["eos_token"] = "<pad>"
        (draft / name).write_text(json.dumps(values))
    target = tokenizer_identity(builtin_dir("tiny-llama"))
    with pytest.raises(KitUsageError) as error:
        check_draft_tokenizer(builtin_dir("tiny-llama"), draft)
    assert str(error.value) == (f"--draft-model {draft} has eos_token id 0 where the target has "
                                f"{target.special_ids['eos_token']}; use a draft with the target's tokenizer.")


def test_renamed_files_do_not_matter(tmp_path: Path) -> None:
    draft = copy_of("tiny-llama", tmp_path / "draft")
    (draft / "special_tokens_map.json").unlink()
    (draft / "model.safetensors").rename(draft / "draft-weights.safetensors")
    check_draft_tokenizer(builtin_dir("tiny-llama"), draft)
