"""Calibration statistics are kept in the kit's cache: a second build of the same model and calibration (another format
into another directory) takes them, says so and writes the checkpoint a calibrating build writes, byte for byte;
another calibration, other weights or another tokenizer calibrate again; an entry that is damaged or of another key
is calibrated again and replaced; a calibration text that cannot be read is refused in one sentence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.checkpoint.calibration_cache import CACHE_DIR, CACHED_CALIBRATION
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.progress import Reporter
from trtllm_kit.spec import build_spec

SMALL = {"calib_samples": 2, "calib_seq_len": 32}
SQ = {"quant": "int8-sq", "per_channel": True, "per_token": True, **SMALL}
FP8 = {"quant": "fp8", **SMALL}
SAID = f"calibrate: {CACHED_CALIBRATION}"


class Notes(Reporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty kit cache of the test's own (the built-in model is generated into it); its calibration folder."""
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path / "kit"))
    return tmp_path / "kit" / CACHE_DIR


def build(out: Path, quant: dict[str, Any], model: str = "builtin:tiny-llama") -> tuple[dict[str, Any], list[str]]:
    """A cpu checkpoint of ``model`` in ``quant``: its calibration record and the build's notes."""
    notes = Notes()
    result = run_build(build_spec({}, {"model": model, "out": out, "quant": quant,
                                       "build": {"target": "cpu", "until": "checkpoint", "verify": False}}), notes)
    record = result.artifact.records.calibration
    assert record is not None
    return record, notes.notes


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith(".")) if cache.is_dir() else []


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_another_format_of_the_same_model_takes_the_statistics_and_writes_the_same_checkpoint(
        cache: Path, tmp_path: Path) -> None:
    first, first_notes = build(tmp_path / "sq", SQ)
    assert first["cached"] is False and SAID not in first_notes
    [entry] = entries(cache)
    second, second_notes = build(tmp_path / "fp8", FP8)
    assert second == {**first, "cached": True} and SAID in second_notes  # the first build's figures, seconds too
    assert not any(note.startswith("calibrate: 2 windows") for note in second_notes)  # nothing ran
    assert entries(cache) == [entry]
    first_stats = load_file(tmp_path / "sq" / "calibration" / "stats.safetensors")
    second_stats = load_file(tmp_path / "fp8" / "calibration" / "stats.safetensors")
    assert first_stats.keys() == second_stats.keys() and all(torch.equal(first_stats[k], second_stats[k])
                                                             for k in first_stats)
    shutil.rmtree(cache)  # the same format calibrated afresh writes the same checkpoint
    fresh, _ = build(tmp_path / "fp8-fresh", FP8)
    assert fresh["cached"] is False
    assert files(tmp_path / "fp8" / "checkpoint") == files(tmp_path / "fp8-fresh" / "checkpoint")


@pytest.mark.parametrize("change", ["seed", "samples", "weights", "tokenizer"])
def test_another_calibration_or_other_files_calibrate_again(cache: Path, tmp_path: Path, change: str) -> None:
    build(tmp_path / "first", SQ)
    model, quant = "builtin:tiny-llama", SQ
    if change in ("weights", "tokenizer"):
        copy = tmp_path / "model"
        shutil.copytree(builtin_dir("tiny-llama"), copy)
        model = str(copy)
    if change == "weights":
        weights = copy / "model.safetensors"
        tensors = load_file(weights)
        name = next(n for n in tensors if n.endswith("q_proj.weight"))
        tensors[name] = tensors[name] * 2
        save_file(tensors, weights, metadata={"format": "pt"})
    elif change == "tokenizer":  # the windows are its tokens
        config = copy / "tokenizer_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 4096}))
    elif change in ("seed", "samples"):
        quant = {**SQ, "calib_seed": 7} if change == "seed" else {**SQ, "calib_samples": 3}
    again, notes = build(tmp_path / "again", quant, model)
    assert again["cached"] is False and SAID not in notes
    assert len(entries(cache)) == 2


@pytest.mark.parametrize("damage", ["truncated", "garbage", "another key"])
def test_a_damaged_or_foreign_entry_is_calibrated_again_and_replaced(cache: Path, tmp_path: Path,
                                                                      damage: str) -> None:
    build(tmp_path / "first", SQ)
    [entry] = entries(cache)
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:-100])
    elif damage == "garbage":
        entry.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    else:  # the entry of another calibration under this key's name
        build(tmp_path / "other", {**SQ, "calib_seed": 7})
        shutil.copyfile(next(p for p in entries(cache) if p != entry), entry)
    again, _ = build(tmp_path / "again", SQ)
    assert again["cached"] is False
    replaced, notes = build(tmp_path / "replaced", SQ)
    assert replaced["cached"] is True and SAID in notes
    assert files(tmp_path / "again" / "checkpoint") == files(tmp_path / "replaced" / "checkpoint")


def test_a_cache_that_cannot_be_written_still_builds(cache: Path, tmp_path: Path) -> None:
    builtin_dir("tiny-llama")  # the model is in the cache; its calibration folder cannot be made
    cache.write_text("a file where the folder would be")
    for name in ("first", "second"):
        record, _ = build(tmp_path / name, SQ)
        assert record["cached"] is False


def test_a_calibration_text_that_cannot_be_read_is_refused_in_one_sentence(cache: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    with pytest.raises(KitUsageError) as refused:
        build(tmp_path / "out", {**SQ, "calib_data": str(missing)})
    assert str(refused.value) == (f"--calib-data {missing} cannot be read (No such file or directory); pass a "
                                  "readable UTF-8 .txt or .jsonl file.")
    assert not (tmp_path / "out").exists() and entries(cache) == []
