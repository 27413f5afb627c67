"""Streamed detokenization with the built-in models' real tokenizer: pieces add up to the whole decoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtllm_kit.models.tokenizer import write_tokenizer
from trtllm_kit.serve.text import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory: Path = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(directory, 2048)
    return Tokenizer(directory)


@pytest.mark.parametrize("text", ["The capital of France is Paris.", "héllo wörld, 日本語 and 🙂!", "  two  spaces"])
def test_pieces_add_up_to_the_whole_decoding(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.hf(text, add_special_tokens=False).input_ids
    decoder = tokenizer.decoder()
    pieces = [decoder.feed([token]) for token in ids]
    assert "".join(pieces) + decoder.flush() == tokenizer.hf.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_a_split_character_waits_for_its_last_byte(tokenizer: Tokenizer) -> None:
    ids = tokenizer.hf("🙂", add_special_tokens=False).input_ids
    assert len(ids) > 1  # byte-level BPE spells a rare character in bytes
    decoder = tokenizer.decoder()
    assert [decoder.feed([token]) for token in ids] == [""] * (len(ids) - 1) + ["🙂"]


def test_special_tokens_are_skipped_and_a_truncated_stream_is_flushed(tokenizer: Tokenizer) -> None:
    decoder = tokenizer.decoder()
    assert decoder.feed([tokenizer.eos_id]) == ""
    partial = tokenizer.hf("🙂", add_special_tokens=False).input_ids[:-1]
    assert decoder.feed(partial) == ""
    assert decoder.flush() == tokenizer.hf.decode(partial)
