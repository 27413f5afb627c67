"""The calibration data (``docs/trtllm-checkpoint.md`` §6): the texts, tokenized into one stream, and the windows
drawn from it.

The text is the corpus shipped with the package (``trtllm_kit/data/corpus.txt``) or ``--calib-data FILE``
(``.txt``: one text per non-empty line; ``.jsonl``: one object with a ``"text"`` string per line). All texts are
tokenized into one stream, and ``samples`` windows of ``seq_len`` tokens (``<bos>`` first when the tokenizer has
one) start at offsets drawn from a ``torch.Generator`` seeded with ``seed``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.text_tokenizer import load_text_tokenizer
from trtllm_kit.models.tokenizer import corpus_path
from trtllm_kit.quant.algos import QuantConfig


def read_texts(path: Path | None) -> list[str]:
    """The calibration texts: the shipped corpus, or a ``.txt`` / ``.jsonl`` file.

    Arguments:
        path: the user's file, or None for the shipped corpus.
    """
    source = path or corpus_path()
    if path is not None and path.suffix not in (".txt", ".jsonl"):
        raise KitUsageError(f"--calib-data {path} has the suffix {path.suffix!r}; pass a .txt file (one text per "
                            "line) or a .jsonl file with a \"text\" field per line.")
    try:
        raw = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _unreadable(source, exc) from None
    if source.suffix == ".jsonl":
        texts = []
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise KitUsageError(f"--calib-data {source}: line {number} is not JSON ({exc.msg}); each line "
                                    "must be an object with a \"text\" string.") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise KitUsageError(f"--calib-data {source}: line {number} has no \"text\" string; each line must "
                                    "be an object with a \"text\" string.")
            texts.append(record["text"])
    else:
        texts = raw.splitlines()
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise KitUsageError(f"--calib-data {source} holds no text; calibration needs at least one non-empty "
                            "line.")
    return texts


def sample_windows(stream: list[int], samples: int, seq_len: int, seed: int,
                   bos_id: int | None) -> list[list[int]]:
    """``samples`` windows of ``seq_len`` tokens at seeded offsets of the token stream (one when it is short).

    Arguments:
        stream: the tokenized texts; samples: windows wanted; seq_len: tokens per window (``<bos>`` included);
        seed: the generator seed; bos_id: prepended to each window when not None.
    """
    body = seq_len - 1 if bos_id is not None else seq_len
    head = [bos_id] if bos_id is not None else []
    if len(stream) <= body:
        return [head + stream]
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - body + 1, (samples,), generator=generator).tolist()
    return [head + stream[s:s + body] for s in starts]


def data_sha256(path: Path | None) -> str:
    """The sha256 of the calibration text's file (the shipped corpus for None); an unreadable file is refused as
    ``read_texts`` refuses it.

    Arguments:
        path: the user's file, or None for the shipped corpus.
    """
    source = path or corpus_path()
    try:
        return hashlib.sha256(source.read_bytes()).hexdigest()
    except OSError as exc:
        raise _unreadable(source, exc) from None


def _unreadable(source: Path, exc: OSError | UnicodeDecodeError) -> KitUsageError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return KitUsageError(f"--calib-data {source} cannot be read ({reason}); pass a readable UTF-8 .txt or .jsonl "
                         "file.")


def token_windows(model_path: Path, config: QuantConfig) -> list[list[int]]:
    """Tokenize the calibration texts with the model's tokenizer and draw the windows.

    Arguments:
        model_path: the HF model directory (its tokenizer is used); config: samples, seq_len, seed, data.
    """
    texts = read_texts(config.calib_data)
    try:
        tokenizer = load_text_tokenizer(model_path)
    except (OSError, ValueError) as exc:
        raise KitUsageError(f"{model_path} has no usable tokenizer ({exc}); calibration tokenizes text with the "
                            "model's own tokenizer.") from None
    stream: list[int] = []
    for text in texts:
        stream += tokenizer.encode(text)
        if tokenizer.eos_id is not None:
            stream.append(tokenizer.eos_id)
    if not stream:
        raise KitUsageError("the calibration texts tokenize to nothing; pass text with content in --calib-data.")
    assert config.calib_samples is not None and config.calib_seq_len is not None, "size it first (sized)"
    return sample_windows(stream, config.calib_samples, config.calib_seq_len, config.calib_seed,
                          tokenizer.bos_id)
