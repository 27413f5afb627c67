"""A SentencePiece vocabulary (``tokenizer.ggml.model`` llama, as Llama 2 and Mistral files carry): its merges come
from the pieces' scores, text is spelled with ``▁`` and bytes stand in for what the vocabulary lacks. The imported
tokenizer splits text as the BPE it was learned as, encodes as transformers' own GGUF reading does, and puts a ``▁``
in front of the text (even one that begins with a space) and after a special token, as llama.cpp does (transformers
adds none in either place)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_files import spm_vocabulary, write_spm_gguf
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.gguf.importer import import_gguf
from trtllm_kit.models.tokenizer import corpus_path
from trtllm_kit.spec import build_spec

TEXT = corpus_path().read_text(encoding="utf-8")[:4000]


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_spm_gguf(builtin_dir("tiny-mistral"), tmp_path_factory.mktemp("spm") / "spm.gguf")


def test_pieces_are_the_learned_bpes(spm_file: Path) -> None:
    imported = Tokenizer.from_file(str(import_gguf(spm_file).model_dir / "tokenizer.json"))
    _, _, _, trained = spm_vocabulary(1031 - 259)
    for line in TEXT.splitlines()[:12]:
        want = trained.encode(line).tokens  # type: ignore[attr-defined]
        assert imported.encode(line, add_special_tokens=False).tokens == want


def test_ids_are_those_transformers_reads_from_the_gguf(spm_file: Path) -> None:
    ours = AutoTokenizer.from_pretrained(import_gguf(spm_file).model_dir)
    theirs = AutoTokenizer.from_pretrained(spm_file.parent, gguf_file=spm_file.name)
    for text in (TEXT, "naïve ｃａｆé ✓ 42", "two  spaces", "tabs\tand\nlines"):
        assert ours(text).input_ids == theirs(text).input_ids, text
    assert ours(TEXT).input_ids[0] == 1  # <s>, as add_bos_token says
    assert ours.decode(ours(TEXT).input_ids, skip_special_tokens=True) == TEXT


def test_a_space_marker_leads_the_text_and_follows_a_special_token_as_llama_cpp_puts_it(spm_file: Path) -> None:
    tokenizer = Tokenizer.from_file(str(import_gguf(spm_file).model_dir / "tokenizer.json"))
    assert tokenizer.encode("</s>the", add_special_tokens=False).tokens[:2] == ["</s>", "\u2581the"]
    assert "".join(tokenizer.encode("  two", add_special_tokens=False).tokens) == "\u2581\u2581\u2581two"


def test_a_sentencepiece_file_builds(spm_file: Path, tmp_path: Path) -> None:
    result = run_build(build_spec({}, {"model": str(spm_file), "out": tmp_path / "out",
                                       "build": {"until": "checkpoint", "target": "cpu"}}))
    assert result.artifact.records.verify is not None and result.artifact.records.verify["passed"]
    assert (tmp_path / "out" / "tokenizer" / "tokenizer.json").is_file()
