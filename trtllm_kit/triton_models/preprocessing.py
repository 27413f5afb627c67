"""Triton ``preprocessing`` model: prompt text → ``input_ids`` and the other tensors ``tensorrt_llm`` reads.

Parameters: ``tokenizer_dir`` (relative to the model directory, or absolute) and ``add_special_tokens``.
Every request of a batch is answered on its own: one that cannot be read (text that is not UTF-8) gets its
error, in one sentence, and the others their results.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from text_codec import flag, model_codec


class InputError(ValueError):
    """A request input that cannot be used, said in one sentence."""


def _text(value, name: str) -> str:
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name} is not UTF-8 text (byte {value[exc.start]:#04x} at offset {exc.start}); send "
                         "UTF-8.") from None


def _strings(request, name: str) -> list[list[str]] | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    rows = tensor.as_numpy()
    return [[_text(v, name) for v in np.atleast_1d(row).tolist() if v] for row in rows]


def _column(request, name: str, batch_size: int, default: int | None) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is not None:
        return tensor.as_numpy().reshape(batch_size, 1).astype(np.int32)
    return np.full((batch_size, 1), -1 if default is None else default, dtype=np.int32)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.codec = model_codec(args, config, "preprocessing")
        self.add_special_tokens = flag(config, "add_special_tokens", True)

    def execute(self, requests):
        return [self._answer(request) for request in requests]

    def _answer(self, request):
        """One request's response, or its error without a traceback (the batch's other requests go on)."""
        try:
            return self._run(request)
        except InputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        except Exception as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"preprocessing failed: {type(exc).__name__}: {exc}"))

    def _run(self, request):
        try:
            queries = [row[0] for row in _strings(request, "QUERY")]
        except (TypeError, IndexError):
            raise InputError("QUERY must hold one string per row.") from None
        batch = len(queries)
        ids = [self.codec.encode(q, add_special_tokens=self.add_special_tokens) for q in queries]
        end_id = _column(request, "END_ID", batch, self.codec.eos_id)
        pad_id = _column(request, "PAD_ID", batch, self.codec.pad_id)
        width = max(len(i) for i in ids)
        input_ids = np.stack([np.pad(np.asarray(i, np.int32), (0, width - len(i)), constant_values=p)
                              for i, p in zip(ids, pad_id[:, 0], strict=True)])
        output_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
        outputs = {
            "INPUT_ID": input_ids,
            "REQUEST_INPUT_LEN": np.asarray([[len(i)] for i in ids], np.int32),
            "BAD_WORDS_IDS": self._word_lists(_strings(request, "BAD_WORDS_DICT"), batch),
            "STOP_WORDS_IDS": self._word_lists(_strings(request, "STOP_WORDS_DICT"), batch),
            "EMBEDDING_BIAS": self._bias(request, batch),
            "REQUEST_OUTPUT_LEN": output_len.reshape(batch, -1).astype(np.int32),
            "OUT_END_ID": end_id,
            "OUT_PAD_ID": pad_id,
        }
        return pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()])

    def _word_lists(self, words: list[list[str]] | None, batch: int) -> np.ndarray:
        """[batch, 2, n]: row 0 the concatenated ids of every word, row 1 the end offsets (padded with -1).
        No words is ``[[0], [-1]]`` per row: one padding slot, which the backends read as an empty list."""
        rows = []
        for row in words or [[]] * batch:
            flat, offsets = [], []
            for word in row:
                flat.extend(self.codec.encode(word, add_special_tokens=False))
                offsets.append(len(flat))
            rows.append((flat, offsets))
        width = max(1, *(len(flat) for flat, _ in rows))
        out = np.zeros((batch, 2, width), np.int32)
        out[:, 1, :] = -1
        for b, (flat, offsets) in enumerate(rows):
            out[b, 0, : len(flat)] = flat
            out[b, 1, : len(offsets)] = offsets
        return out

    def _bias(self, request, batch: int) -> np.ndarray:
        words = _strings(request, "EMBEDDING_BIAS_WORDS")
        weights = pb_utils.get_input_tensor_by_name(request, "EMBEDDING_BIAS_WEIGHTS")
        if not words or weights is None or not any(words):
            return np.empty((batch, 0), np.float32)
        bias = np.zeros((batch, self.codec.vocab_size), np.float32)
        for b, (row, row_weights) in enumerate(zip(words, weights.as_numpy(), strict=True)):
            for word, weight in zip(row, row_weights, strict=False):
                ids = self.codec.encode(word, add_special_tokens=False)
                if ids:
                    bias[b, ids[0]] += weight
        return bias
