"""Streamed detokenization with the built-in models' real tokenizer: pieces add up to the whole decoding; stop
sequences cut a stream in pieces exactly where they cut the whole text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from trtllm_kit.models.tokenizer import write_tokenizer
from trtllm_kit.serve.openai.text import StopMatcher, Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory: Path = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(directory, 2048)
    return Tokenizer(directory)


@pytest.mark.parametrize("text", ["The capital of France is Paris.", "héllo wörld, 日本語 and 🙂!", "  two  spaces"])
def test_pieces_add_up_to_the_whole_decoding(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.hf.encode(text, add_special_tokens=False)
    decoder = tokenizer.decoder()
    pieces = [decoder.feed([token]) for token in ids]
    assert "".join(pieces) + decoder.flush() == tokenizer.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_random_ids_decoded_in_pieces_equal_their_whole_decoding(tokenizer: Tokenizer) -> None:
    """A whole answer is decoded at once, a streamed one in pieces: the same text, split characters and byte
    sequences that are not UTF-8 (which a small model makes) among them."""
    rng = random.Random(3)
    num_split = 0
    for _ in range(300):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 40))]
        decoder = tokenizer.decoder()
        pieces = [decoder.feed([token]) for token in ids]
        whole = tokenizer.decode(ids)
        assert "".join(pieces) + decoder.flush() == whole, ids
        num_split += "" in pieces and "\ufffd" in whole
    assert num_split > 0  # the byte sequences that are not UTF-8 were met


def test_a_split_character_waits_for_its_last_byte(tokenizer: Tokenizer) -> None:
    ids = tokenizer.hf.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # byte-level BPE spells a rare character in bytes
    decoder = tokenizer.decoder()
    assert [decoder.feed([token]) for token in ids] == [""] * (len(ids) - 1) + ["🙂"]


def test_special_tokens_are_skipped_and_a_truncated_stream_is_flushed(tokenizer: Tokenizer) -> None:
    decoder = tokenizer.decoder()
    assert decoder.feed([tokenizer.eos_id]) == ""
    partial = tokenizer.hf.encode("🙂", add_special_tokens=False)[:-1]
    assert decoder.feed(partial) == ""
    assert decoder.flush() == tokenizer.decode(partial)


def cut_at_first_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """The reference: the whole text cut before the stop sequence that ends first (the longer one on a tie)."""
    hits = [(i + len(s), i) for i, s in ((text.find(s), s) for s in stops if s) if i >= 0]
    return (text[:min(hits)[1]], True) if hits else (text, False)


@pytest.mark.parametrize("adds_bos", [True, False])
def test_a_bos_the_template_writes_is_sent_once(tmp_path: Path, adds_bos: bool) -> None:
    """A template that starts with the BOS text: dropped from the prompt when encoding adds the BOS itself, so the
    model sees one; kept when it does not."""
    write_tokenizer(tmp_path, 2048)
    if not adds_bos:  # a tokenizer.json whose post-processor adds no BOS
        spec = json.loads((tmp_path / "tokenizer.json").read_text())
        spec["post_processor"] = None
        (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(template)
    tokenizer = Tokenizer(tmp_path)
    bos = tokenizer.hf.special_tokens["bos_token"]
    prompt = tokenizer.chat_prompt([{"role": "user", "content": "hi"}])
    assert prompt == ("hi" if adds_bos else f"{bos}hi")
    assert tokenizer.encode(prompt).count(tokenizer.hf.token_id("bos_token")) == 1


def test_stop_matching_in_pieces_equals_cutting_the_whole_text() -> None:
    """Random streams over a small alphabet (many partial matches and overlaps), cut into random pieces."""
    rng = random.Random(7)
    for _ in range(2000):
        stops = ["".join(rng.choices("abc", k=rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choices("abcd", k=rng.randint(0, 40)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(1, 8))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        matcher = StopMatcher(stops)
        shown = "".join(matcher.feed(p) for p in pieces) + matcher.flush()
        assert (shown, matcher.stopped) == cut_at_first_stop(text, stops), (stops, pieces)


def test_a_long_stop_sequence_held_back_across_many_pieces() -> None:
    stop = "x" * 999 + "y"
    matcher = StopMatcher([stop, "never"])
    assert [matcher.feed("x" * 500), matcher.feed("x" * 600)] == ["", "x" * 101]  # 999 x's may still begin it
    assert matcher.feed("y tail") == "" and matcher.stopped


def test_include_stop_shows_the_stop_sequence_that_ended_the_text() -> None:
    matcher = StopMatcher(["cd", "de"], include=True)
    assert [matcher.feed("abc"), matcher.feed("def")] == ["ab", "cd"] and matcher.stopped
