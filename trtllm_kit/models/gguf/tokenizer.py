"""A GGUF file's tokenizer written as Hugging Face files that transformers 4.57 and 5.x both read.

GGUF keeps the vocabulary, merges, token kinds, special ids and chat template as ``tokenizer.*`` metadata; the
text splitting before BPE is named, not stored (``tokenizer.ggml.pre``), so each name the kit imports is one
``Pretokenization`` entry, the regular expressions llama.cpp gives that name. Byte-level BPE (``gpt2``) and
SentencePiece BPE (``llama``, ``spm.py``) are imported; other tokenizer models are refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from trtllm_kit.errors import ModelError
from trtllm_kit.models.gguf.header import GGUFHeader
from trtllm_kit.models.gguf.spm import spm_tokenizer

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


@dataclass(frozen=True)
class Pretokenization:
    """How text is cut before BPE: regular expressions applied in turn (each match kept as a piece), NFC first or
    not, and whether a piece that is itself a token skips the merges (Llama 3)."""

    splits: tuple[str, ...]
    nfc: bool = False
    ignore_merges: bool = False


PRETOKENIZATIONS: dict[str, Pretokenization] = {
    "gpt-2": Pretokenization((GPT2_SPLIT,)),
    "smollm": Pretokenization((r"\p{N}", GPT2_SPLIT)),  # every digit on its own, then GPT-2's pieces
    "starcoder": Pretokenization((r"\p{N}", GPT2_SPLIT)),
    "qwen2": Pretokenization((QWEN2_SPLIT,), nfc=True),
    "llama-bpe": Pretokenization((LLAMA3_SPLIT,), ignore_merges=True),
    "llama3": Pretokenization((LLAMA3_SPLIT,), ignore_merges=True),
}


@dataclass(frozen=True)
class GGUFTokenizer:
    """What the metadata says, checked: tokens, merges, kinds, special ids, flags and the chat template."""

    kind: str  # tokenizer.ggml.model: gpt2 (byte-level BPE) or llama (SentencePiece BPE)
    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    pretokenization: Pretokenization
    special_ids: dict[str, int | None]  # bos, eos (the end of a turn where the file names one), unk, pad
    eos_ids: list[int]                  # every id that ends generation
    add_bos: bool
    chat_template: str | None
    scores: list[float] | None = None  # SentencePiece: each piece's score, which orders the merges
    add_space_prefix: bool = True      # SentencePiece: a ▁ in front of the text

    def added(self) -> list[tuple[int, str, bool]]:
        """(id, token, is special) of each token matched whole in text: control tokens (special) and user-defined
        ones (not special)."""
        return [(i, t, kind == CONTROL) for i, (t, kind) in enumerate(zip(self.tokens, self.token_types, strict=True))
                if kind in (CONTROL, USER_DEFINED)]

    def token(self, key: str) -> str | None:
        token_id = self.special_ids[key]
        return None if token_id is None else self.tokens[token_id]


def read_tokenizer(header: GGUFHeader) -> GGUFTokenizer:
    """The tokenizer metadata of a GGUF file, refused in one sentence where the kit cannot rebuild it.

    Arguments:
        header: the file's header.
    """
    meta, path = header.metadata, header.path
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ModelError(f"{path}: tokenizer.ggml.model is {kind!r}; the kit imports byte-level BPE ('gpt2') and "
                         "SentencePiece BPE ('llama') tokenizers, so give the model as a Hugging Face directory "
                         "instead.")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2") if kind == "gpt2" else "gpt-2"  # SentencePiece splits nothing
    if pre not in PRETOKENIZATIONS:
        raise ModelError(f"{path}: tokenizer.ggml.pre is {pre!r}, a text splitting the kit does not know; it knows "
                         f"{', '.join(PRETOKENIZATIONS)}.")
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges", [] if kind == "llama" else None)  # SentencePiece: from the scores
    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(tokens, list) or not isinstance(merges, list) or not tokens:
        raise ModelError(f"{path} has no tokenizer.ggml.tokens or tokenizer.ggml.merges string arrays; the file "
                         "holds no usable tokenizer.")
    if kind == "llama" and (not isinstance(scores, np.ndarray) or len(scores) != len(tokens)):
        raise ModelError(f"{path}: a SentencePiece vocabulary needs tokenizer.ggml.scores, one number per token; the "
                         "file holds no usable tokenizer.")
    if len(set(tokens)) != len(tokens):
        raise ModelError(f"{path}: tokenizer.ggml.tokens lists a token twice; the file is damaged: "
                         "download or convert it again.")
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and not isinstance(types, np.ndarray):  # strings or one value where numbers belong
        raise ModelError(f"{path}: tokenizer.ggml.token_type is not an array of numbers; the file is damaged: "
                         "download or convert it again.")
    token_types = [int(t) for t in types] if types is not None else [1] * len(tokens)
    if len(token_types) != len(tokens):
        raise ModelError(f"{path}: tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens; "
                         "the file is damaged: download or convert it again.")
    ids = {key: _token_id(header, f"tokenizer.ggml.{name}", len(tokens)) for key, name in
           (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"), ("unk_token_id", "unknown_token_id"),
            ("pad_token_id", "padding_token_id"))}
    eot = _token_id(header, "tokenizer.ggml.eot_token_id", len(tokens))
    eos_ids = [i for i in (eot, ids["eos_token_id"]) if i is not None]
    if eot is not None:  # chat serving stops at the end of a turn
        ids["eos_token_id"] = eot
    template = meta.get("tokenizer.chat_template")
    return GGUFTokenizer(kind, tokens, merges, token_types, PRETOKENIZATIONS[pre], ids, list(dict.fromkeys(eos_ids)),
                         bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")),
                         template if isinstance(template, str) else None,
                         [float(x) for x in scores] if kind == "llama" and scores is not None else None,
                         bool(meta.get("tokenizer.ggml.add_space_prefix", True)))


def _token_id(header: GGUFHeader, key: str, vocab_size: int) -> int | None:
    value = header.metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ModelError(f"{header.path}: {key} is {value!r}, not a token id below {vocab_size}; the file is damaged: "
                         "download or convert it again.")
    return value


def build_tokenizer(spec: GGUFTokenizer) -> Tokenizer:
    """The ``tokenizers`` object: byte-level BPE over the file's vocabulary and merges, its added tokens whole.

    Arguments:
        spec: the file's tokenizer.
    """
    vocab = {token: index for index, token in enumerate(spec.tokens)}
    try:
        tokenizer = _sentencepiece(spec) if spec.kind == "llama" else _byte_level(spec, vocab)
    except Exception as exc:  # tokenizers raises plain Exceptions (a merge of unknown tokens, ...)
        if isinstance(exc, ModelError):
            raise
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"the GGUF file's tokenizer cannot be built ({reason}); the file is damaged: "
                         "download or convert it again.") from None
    bos = spec.token("bos_token_id")
    if spec.add_bos and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, vocab[bos])])
    elif spec.kind == "gpt2":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t, special in spec.added()
                                  if special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for _, t, special in spec.added()
                          if not special])
    return tokenizer


def _byte_level(spec: GGUFTokenizer, vocab: dict[str, int]) -> Tokenizer:
    pairs = []
    for merge in spec.merges:
        left, _, right = merge.partition(" ")
        if not left or not right:
            raise ModelError(f"the GGUF merge {merge!r} is not two tokens separated by a space; the file is damaged: "
                             "download or convert it again.")
        pairs.append((left, right))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=spec.pretokenization.ignore_merges))
    pre = spec.pretokenization
    if pre.nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        *(pre_tokenizers.Split(Regex(split), behavior="isolated") for split in pre.splits),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece(spec: GGUFTokenizer) -> Tokenizer:
    assert spec.scores is not None, "read_tokenizer requires them"
    return spm_tokenizer(spec.tokens, spec.scores, spec.token_types, spec.token("unk_token_id"), spec.add_space_prefix)


def write_tokenizer_files(spec: GGUFTokenizer, model_dir: Path, model_max_length: int) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` (with the chat template), ``special_tokens_map.json`` and
    ``generation_config.json`` into ``model_dir``.

    Arguments:
        spec: the file's tokenizer; model_dir: the directory being written; model_max_length: the context length.
    """
    build_tokenizer(spec).save(str(model_dir / "tokenizer.json"))
    special = {name: spec.token(f"{name}_id") for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": special} for i, t, special in spec.added()}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added, **special,
        "add_bos_token": spec.add_bos and special["bos_token"] is not None, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": model_max_length,
        **({"chat_template": spec.chat_template} if spec.chat_template else {}),
    }
    generation = {"bos_token_id": spec.special_ids["bos_token_id"], "pad_token_id": spec.special_ids["pad_token_id"],
                  "eos_token_id": spec.eos_ids[0] if len(spec.eos_ids) == 1 else spec.eos_ids or None}
    files = {"tokenizer_config.json": config,
             "special_tokens_map.json": {k: v for k, v in special.items() if v is not None},
             "generation_config.json": {k: v for k, v in generation.items() if v is not None}}
    for name, content in files.items():
        (model_dir / name).write_text(json.dumps(content, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
