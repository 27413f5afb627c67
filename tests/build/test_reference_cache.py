"""The unquantized reference verify computes is kept in the kit's cache: a second verify of the same model and inputs
reads it (with the same figures, bit for bit), and an entry that is corrupt, of another key or of other inputs is
computed again and replaced."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.checkpoint.heldout import corpus_windows
from trtllm_kit.checkpoint.quality import load_questions
from trtllm_kit.checkpoint.reference import computed_reference, reference_outputs
from trtllm_kit.checkpoint.reference_cache import CACHE_DIR, Reference
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.cache_dir import STALE_TMP_SECONDS
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.progress import Reporter
from trtllm_kit.targets.checkpoint_stage import run_verify

F32 = torch.float32


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of ``builtin:tiny-llama`` (some tests change its files)."""
    copy = tmp_path_factory.mktemp("model") / "tiny-llama"
    shutil.copytree(builtin_dir("tiny-llama"), copy)
    return copy


@pytest.fixture(scope="module")
def ckpt(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "float32"
    convert_checkpoint(hf_dir, out, tp_size=1, pp_size=1, dtype="float32")
    return out


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty kit cache of the test's own; its reference entries' folder."""
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path / "kit"))
    return tmp_path / "kit" / CACHE_DIR


def entries(cache: Path) -> list[Path]:
    return sorted(cache.iterdir()) if cache.is_dir() else []


def test_the_held_out_windows_and_the_picks_are_cached_as_computed(hf_dir: Path, cache: Path) -> None:
    prompts, windows, questions = [[1, 2, 3]], corpus_windows(hf_dir)[:2], load_questions()[:3]
    fresh = reference_outputs(hf_dir, F32, F32, prompts, windows, questions)
    cached = reference_outputs(hf_dir, F32, F32, prompts, windows, questions)
    assert not fresh.is_cached and cached.is_cached
    assert len(cached.window_logits) == 2 and len(cached.picks) == 3 and cached.picks == fresh.picks
    for got, want in zip([*cached.prompt_logits, *cached.window_logits],
                         [*fresh.prompt_logits, *fresh.window_logits], strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_other_inputs_or_dtypes_or_weights_are_other_entries(hf_dir: Path, cache: Path, tmp_path: Path) -> None:
    reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], [])
    assert not reference_outputs(hf_dir, F32, F32, [[1, 2, 4]], [], []).is_cached
    assert not reference_outputs(hf_dir, torch.bfloat16, F32, [[1, 2, 3]], [], []).is_cached
    assert not reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [[5, 6, 7]], []).is_cached
    assert len(entries(cache)) == 4
    changed = tmp_path / "changed"
    shutil.copytree(hf_dir, changed)
    weights = changed / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    weights.write_bytes(bytes(data))
    assert not reference_outputs(changed, F32, F32, [[1, 2, 3]], [], []).is_cached
    assert reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], []).is_cached


@pytest.mark.parametrize("damage", ["truncated", "garbage", "another key", "another shape"])
def test_a_damaged_or_foreign_entry_is_computed_again_and_replaced(hf_dir: Path, cache: Path, damage: str) -> None:
    prompts = [[1, 2, 3]]
    fresh = reference_outputs(hf_dir, F32, F32, prompts, [], [])
    [entry] = entries(cache)
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:-100])
    elif damage == "garbage":
        entry.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    else:
        other = reference_outputs(hf_dir, F32, F32, [[4, 5]] if damage == "another key" else [[1, 2]], [], [])
        other_entry = next(p for p in entries(cache) if p != entry)
        if damage == "another shape":  # an entry of this key whose logits are not the prompts' length
            from trtllm_kit.checkpoint.reference_cache import read_entry, reference_key, write_entry

            key = reference_key(hf_dir, "float32", "float32", prompts, [], [])
            found = read_entry(other_entry, reference_key(hf_dir, "float32", "float32", [[1, 2]], [], []))
            assert found is not None and found.prompt_logits[0].shape[1] == 2 == other.prompt_logits[0].shape[1]
            write_entry(entry, key, Reference(found.prompt_logits, [], ()))
        else:
            shutil.copyfile(other_entry, entry)
    again = reference_outputs(hf_dir, F32, F32, prompts, [], [])
    assert not again.is_cached and torch.equal(again.prompt_logits[0], fresh.prompt_logits[0])
    replaced = reference_outputs(hf_dir, F32, F32, prompts, [], [])
    assert replaced.is_cached and torch.equal(replaced.prompt_logits[0], fresh.prompt_logits[0])


def test_an_entry_is_renamed_into_place_and_stale_temporaries_are_removed(hf_dir: Path, cache: Path) -> None:
    cache.mkdir(parents=True)
    stale, recent = cache / ".x.safetensors.1.tmp", cache / ".y.safetensors.2.tmp"
    for path in (stale, recent):
        path.write_bytes(b"partial")
    old = time.time() - STALE_TMP_SECONDS - 60
    os.utime(stale, (old, old))
    reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], [])
    assert [p.name for p in entries(cache) if not p.name.startswith(".")] != []
    assert sorted(p.name for p in entries(cache) if p.name.startswith(".")) == [recent.name]


def test_a_cache_that_cannot_be_written_still_verifies(hf_dir: Path, cache: Path) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder would be")
    reference = reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], [])
    assert not reference.is_cached
    assert torch.equal(reference.prompt_logits[0], computed_reference(hf_dir, F32, F32, [[1, 2, 3]], [], [])
                       .prompt_logits[0])


class Notes(Reporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


def test_a_second_verify_reads_the_reference_says_so_and_reports_the_same_figures(ckpt: Path, hf_dir: Path,
                                                                                  cache: Path) -> None:
    model = inspect_model(str(hf_dir))
    said = "verify: the unquantized model's answers came from the kit's cache (verify-reference/)"
    first_notes, second_notes = Notes(), Notes()
    first = run_verify(ckpt, model, first_notes)
    assert first["reference_cached"] is False and first["passed"] and said not in first_notes.notes
    [entry] = entries(cache)
    assert entry.suffix == ".safetensors"
    second = run_verify(ckpt, model, second_notes)
    assert second == {**first, "reference_cached": True} and said in second_notes.notes  # the same floats
    assert entries(cache) == [entry]


def test_the_folder_keeps_the_recently_used_entries_within_its_bound(hf_dir: Path, cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import trtllm_kit.checkpoint.reference_cache as reference_cache

    first = reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], [])
    [entry] = entries(cache)
    monkeypatch.setattr(reference_cache, "MAX_CACHE_BYTES", int(entry.stat().st_size * 2.5))  # room for two
    reference_outputs(hf_dir, F32, F32, [[1, 2, 4]], [], [])
    old = time.time() - 3600
    for path in entries(cache):
        os.utime(path, (old, old))
    assert reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], []).is_cached  # read: now the most recently used
    reference_outputs(hf_dir, F32, F32, [[1, 2, 5]], [], [])  # a third: the least recently used one goes
    assert len(entries(cache)) == 2
    assert reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], []).is_cached
    assert not reference_outputs(hf_dir, F32, F32, [[1, 2, 4]], [], []).is_cached
    assert first.prompt_logits[0].shape[1] == 3


def test_an_entry_larger_than_the_bound_is_kept_alone(hf_dir: Path, cache: Path) -> None:
    from trtllm_kit.checkpoint.cache_entries import evict

    reference_outputs(hf_dir, F32, F32, [[1, 2, 3]], [], [])
    reference_outputs(hf_dir, F32, F32, [[1, 2, 4]], [], [])
    newest = max(entries(cache), key=lambda p: p.stat().st_mtime_ns)
    assert evict(cache, keep=newest, max_bytes=1) != []
    assert entries(cache) == [newest]
