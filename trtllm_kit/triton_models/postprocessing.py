"""Triton ``postprocessing`` model: ``output_ids`` → text, one string per sequence (beam).

Parameters: ``tokenizer_dir`` (relative to the model directory, or absolute) and ``skip_special_tokens``.
In streaming mode each chunk is decoded on its own; ``tensorrt_llm_bls`` accumulates tokens instead.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from text_codec import flag, model_codec


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.codec = model_codec(args, config, "postprocessing")
        self.skip_special_tokens = flag(config, "skip_special_tokens", True)

    def execute(self, requests):
        return [self._answer(request) for request in requests]

    def _answer(self, request):
        """One request's text, or its error in one sentence (the batch's other requests go on)."""
        try:
            return self._run(request)
        except Exception as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"postprocessing failed: {type(exc).__name__}: {exc}", pb_utils.TritonError.INVALID_ARG))

    def _run(self, request):
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])  # [batch, beams, tokens]
        lengths = lengths.reshape(tokens.shape[0], -1)
        texts = [[self.codec.decode(beam[: int(n)].tolist(), skip_special_tokens=self.skip_special_tokens)
                  .encode() for beam, n in zip(row, row_lengths, strict=True)]
                 for row, row_lengths in zip(tokens, lengths, strict=True)]
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array(texts, dtype=object))])
