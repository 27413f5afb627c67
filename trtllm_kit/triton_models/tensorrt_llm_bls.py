"""Triton ``tensorrt_llm_bls`` model: text in → text out by calling ``preprocessing``, the model named by
``tensorrt_llm_model_name`` and ``postprocessing`` in-process (no network, any gRPC port).

Decoupled (the config's transaction policy): each request runs in its own thread and streams one response per
``tensorrt_llm`` response when ``stream`` is true. With ``accumulate_tokens`` the postprocessing model decodes
all tokens so far and only the new text is sent, so multi-byte characters split across tokens come out whole.

Cancellation: the response iterator of an inner call cannot be cancelled from a Python model, so when the
client cancels (a closed stream) the BLS sends ``tensorrt_llm`` a request with the inner call's id and
``stop = true``, as the TensorRT-LLM backend defines it; the engine drops the sequence at its next step and
answers the stopped call with its final response, which the BLS reads before it lets the call go. The same
happens when sending to the client fails mid-stream (the generator is closed): the inner call is stopped, not
left running to ``max_tokens``. (Triton 2.51's Python backend can still crash under a high rate of such
cancellations: README, "Serving reliability".)
(Triton 2.51's ensemble passes no cancellation to its steps: a client of ``ensemble`` that leaves does not
stop its generation, which is why ``serve`` prefers the BLS.)
Errors reach the client as one sentence with the inner model's status code, never a traceback.

Draft-target speculation (``tensorrt_llm_draft_model_name`` set, ``num_draft_tokens`` > 0) runs in rounds
(``draft_rounds.py``), streamed one response per round, each with the acceptance outputs so far.
"""

from __future__ import annotations

import json
import threading
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_kit.errors import KitUsageError
from trtllm_kit.triton_models.draft_rounds import (
    DRAFT_MODEL_PARAMETER,
    NUM_DRAFT_TOKENS,
    USE_DRAFT_LOGITS,
    acceptance_arrays,
    chunks,
    request_loop,
)
from trtllm_kit.triton_models.triton_io import coded_error, inner_error
from trtllm_kit.wire.scalars import SCALARS

LORA_INPUTS = ("lora_task_id", "lora_weights", "lora_config")  # passed on as they came (any weights dtype)
PREPROCESSING_INPUTS = (
    ("text_input", "QUERY"), ("max_tokens", "REQUEST_OUTPUT_LEN"), ("bad_words", "BAD_WORDS_DICT"),
    ("stop_words", "STOP_WORDS_DICT"), ("embedding_bias_words", "EMBEDDING_BIAS_WORDS"),
    ("embedding_bias_weights", "EMBEDDING_BIAS_WEIGHTS"), ("end_id", "END_ID"), ("pad_id", "PAD_ID"),
)
# upstream's inputs the BLS passes on unchanged that are no field of the wire's request (read by no kit code)
UPSTREAM_PASSTHROUGH = (("return_log_probs", "return_log_probs"), ("prompt_embedding_table", "prompt_embedding_table"),
                        ("prompt_vocab_size", "prompt_vocab_size"))
# (BLS input, tensorrt_llm input) for the inputs passed straight through (the wire's text-interface rows that do
# not go through preprocessing); the rest go through preprocessing.
PASSTHROUGH_INPUTS = (*((text, trtllm) for row in SCALARS if (text := row.tensor("text")) is not None
                        and (trtllm := row.tensor("trtllm")) is not None and text not in dict(PREPROCESSING_INPUTS)),
                      *UPSTREAM_PASSTHROUGH)
PREPROCESSING_OUTPUTS = (
    ("INPUT_ID", "input_ids"), ("REQUEST_INPUT_LEN", "input_lengths"), ("REQUEST_OUTPUT_LEN", "request_output_len"),
    ("STOP_WORDS_IDS", "stop_words_list"), ("BAD_WORDS_IDS", "bad_words_list"), ("EMBEDDING_BIAS", "embedding_bias"),
    ("OUT_END_ID", "end_id"), ("OUT_PAD_ID", "pad_id"),
)
TRTLLM_OUTPUTS = (
    "output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits", "generation_logits",
    "batch_index", "sequence_index", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
    "last_token_time_ns", "num_input_tokens", "num_output_tokens",
)


class BlsError(Exception):
    """A called model answered with an error (its Triton status code kept)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = pb_utils.TritonError.INTERNAL if code is None else code


class InnerCallError(BlsError):
    """The ``tensorrt_llm`` call answered with an error: its final response."""


class Cancelled(Exception):
    """The client cancelled the request."""


def _error(error, kind: type[BlsError] = BlsError) -> BlsError:
    """A ``TritonError`` of an inner call as a ``BlsError``: its first line (the Python backend appends the
    failing model's traceback under "At:") and its code."""
    message = error.message().split("\n\nAt:")[0].strip()
    try:
        return kind(message, error.code())
    except Exception:  # a stub without TritonError.code()
        return kind(message)


def _triton_error(exc: Exception):
    """The error a client gets for ``exc``: its message in one sentence, marked with its status code
    (``wire/error_code.py``); an inner model's error as ``inner_error`` passes it on."""
    if isinstance(exc, Cancelled):
        return coded_error(pb_utils, "the request was cancelled", "CANCELLED")
    if isinstance(exc, BlsError):
        return inner_error(pb_utils, str(exc), exc.code)
    if isinstance(exc, KitUsageError):  # a refusal of the kit's own: the request's fault
        return coded_error(pb_utils, str(exc), "INVALID_ARG")
    return coded_error(pb_utils, f"tensorrt_llm_bls failed: {exc}", "INTERNAL")


def _first(request, name: str):
    """The first value of an optional input (None: not sent)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _exec(request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
    response = request.exec()
    if response.has_error():
        raise _error(response.error())
    return response


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})

        def parameter(key: str, default: str) -> str:
            value = (parameters.get(key) or {}).get("string_value", "")
            return default if not value or value.startswith("${") else value

        self.trtllm_name = parameter("tensorrt_llm_model_name", "tensorrt_llm")
        self.draft_name = parameter(DRAFT_MODEL_PARAMETER, "")  # "": no draft-target speculation
        self.pre_name = parameter("preprocessing_model_name", "preprocessing")  # renamed when repos are merged
        self.post_name = parameter("postprocessing_model_name", "postprocessing")
        self.accumulate = parameter("accumulate_tokens", "false").lower() in ("true", "yes", "1", "t")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.num_running = 0

    def execute(self, requests):
        if not self.decoupled:
            return [self._respond_once(request) for request in requests]
        for request in requests:
            with self.lock:
                self.num_running += 1
            threading.Thread(target=self._stream, args=(request, request.get_response_sender()), daemon=True).start()
        return None

    def finalize(self):
        with self.idle:
            self.idle.wait_for(lambda: self.num_running == 0, timeout=30)

    def _respond_once(self, request):
        try:
            chunks = list(self._generate(request))
        except Exception as exc:  # one sentence, never a traceback with server paths
            return pb_utils.InferenceResponse(error=_triton_error(exc))
        text = b"".join(c[0] for c in chunks)
        extra = next((c[1] for c in reversed(chunks) if c[1]), [])
        return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([text], dtype=object)), *extra])

    def _stream(self, request, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        chunks = self._generate(request, sender)
        try:
            for text, extra in chunks:
                tensors = [pb_utils.Tensor("text_output", np.array([text], dtype=object)), *extra]
                sender.send(pb_utils.InferenceResponse(tensors))
            sender.send(flags=final)
        except Exception as exc:  # every failure must reach the client as the final response
            error = _triton_error(exc)
            try:
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
            except Exception as send_error:  # a cancelled request may refuse its final response
                pb_utils.Logger.log_warn(f"tensorrt_llm_bls: final response not sent: {send_error}")
        finally:
            chunks.close()  # a send that failed leaves the inner call running: stop it and read its end now
            with self.idle:
                self.num_running -= 1
                self.idle.notify_all()

    def _generate(self, request, sender=None):
        """Yield (new text as bytes, pass-through tensors) per tensorrt_llm response; a cancellation seen through
        ``sender`` stops the inner call and raises ``Cancelled``."""
        if _first(request, "stream") and not self.decoupled:
            raise KitUsageError("stream=true needs a decoupled tensorrt_llm_bls model; regenerate the repository "
                                "with decoupled = true or send stream=false.")
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
        if text.shape[0] != 1:
            raise KitUsageError(f"tensorrt_llm_bls takes one prompt per request, got a batch of {text.shape[0]}; "
                                "send one request per prompt (they are batched in flight anyway).")
        pre_inputs = [pb_utils.Tensor(target, t.as_numpy()) for source, target in PREPROCESSING_INPUTS
                      if (t := pb_utils.get_input_tensor_by_name(request, source)) is not None]
        pre = _exec(pb_utils.InferenceRequest(model_name=self.pre_name, inputs=pre_inputs,
                                              requested_output_names=[n for n, _ in PREPROCESSING_OUTPUTS]))
        inputs = []
        for source, target in PREPROCESSING_OUTPUTS:
            value = pb_utils.get_output_tensor_by_name(pre, source).as_numpy()
            if value.size or target in ("input_ids",):
                inputs.append(pb_utils.Tensor(target, value))
        inputs += [pb_utils.Tensor(target, t.as_numpy()) for source, target in PASSTHROUGH_INPUTS
                   if (t := pb_utils.get_input_tensor_by_name(request, source)) is not None]
        inputs += [t for name in LORA_INPUTS if (t := pb_utils.get_input_tensor_by_name(request, name)) is not None]
        if sender is not None and sender.is_cancelled():
            raise Cancelled
        if (num_draft := int(_first(request, NUM_DRAFT_TOKENS) or 0)) > 0:  # draft-target speculation
            arrays = {t.name(): t.as_numpy() for t in inputs}
            return (yield from self._decode_texts(self._speculate(request, arrays, num_draft, sender)))
        inner_id = uuid.uuid4().hex
        call = pb_utils.InferenceRequest(model_name=self.trtllm_name, inputs=inputs, request_id=inner_id,
                                         requested_output_names=list(TRTLLM_OUTPUTS))
        responses = call.exec(decoupled=True) if self.decoupled else [_exec(call)]
        ended = not self.decoupled  # the inner call's final response has been read (or there is no iterator)
        try:
            yield from self._decode_texts(self._token_batches(responses, sender))
            ended = True
        except InnerCallError:  # an error response of the inner call is its final one
            ended = True
            raise
        finally:
            if not ended:  # cancelled, or the client's sender failed: stop the inner call and read its end
                self._stop(inner_id)
                for _ in responses:
                    pass

    def _speculate(self, request, arrays, num_draft_tokens: int, sender):
        """Yield ([1, 1, n] new tokens, the acceptance outputs) per round, or of all rounds unless streamed."""
        loop = request_loop(arrays, num_draft_tokens, lambda name, inputs: self._call(name, inputs, sender),
                            (self.draft_name, self.trtllm_name), bool(_first(request, USE_DRAFT_LOGITS)))
        for token_ids in chunks(loop, bool(_first(request, "stream"))):
            yield np.array([[token_ids]], np.int32), [pb_utils.Tensor(name, value) for name, value
                                                      in acceptance_arrays(loop.acceptance).items()]

    def _call(self, model_name: str, arrays, sender):
        """The generated ids of a non-streamed call to a ``tensorrt_llm`` model, and its generation logits."""
        call = pb_utils.InferenceRequest(model_name=model_name, requested_output_names=list(TRTLLM_OUTPUTS),
                                         inputs=[pb_utils.Tensor(name, value) for name, value in arrays.items()])
        batches = list(self._token_batches(call.exec(decoupled=True) if self.decoupled else [_exec(call)], sender))
        ids, extra = batches[-1] if batches else (np.zeros(0, np.int32), [])
        return ids.reshape(-1).tolist(), next((t.as_numpy() for t in extra if t.name() == "generation_logits"), None)

    def _token_batches(self, responses, sender):
        """Yield ([batch, beams, n] new tokens, pass-through tensors) per inner response; raise ``Cancelled`` when
        the client left."""
        for response in responses:
            if sender is not None and sender.is_cancelled():
                raise Cancelled
            if response.has_error():
                raise _error(response.error(), InnerCallError)
            ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
            if ids is None:  # the empty final response of a decoupled model
                continue
            ids = ids.as_numpy()
            lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy()
            ids = np.stack([[beam[: int(n)] for beam, n in zip(row, ns, strict=True)]
                            for row, ns in zip(ids, lengths, strict=True)]) if lengths.size else ids
            extra = [pb_utils.Tensor(name, value.as_numpy()) for name in TRTLLM_OUTPUTS[2:]
                     if (value := pb_utils.get_output_tensor_by_name(response, name)) is not None]
            yield ids, extra

    def _decode_texts(self, batches):
        """Yield (new text as bytes, pass-through tensors) per batch of new tokens."""
        tokens = None  # accumulated [batch, beams, n]
        sent = b""
        for ids, extra in batches:
            tokens = ids if tokens is None or not self.accumulate else np.concatenate([tokens, ids], axis=-1)
            text = self._detokenize(tokens)
            if self.accumulate:
                stable = text[: len(text) - 3] if text.endswith("\ufffd".encode()) else text
                new, sent = stable[len(sent):], stable
            else:
                new = text
            yield new, extra
        if self.accumulate and tokens is not None:
            rest = self._detokenize(tokens)[len(sent):]
            if rest:
                yield rest, []

    def _stop(self, inner_id: str) -> None:
        """Ask ``tensorrt_llm`` to stop the request ``inner_id`` (its ``stop`` input; the other required inputs
        are placeholders)."""
        one = np.ones((1, 1), np.int32)
        stop = pb_utils.InferenceRequest(
            model_name=self.trtllm_name, request_id=inner_id, requested_output_names=["output_ids"],
            inputs=[pb_utils.Tensor("input_ids", one), pb_utils.Tensor("input_lengths", one),
                    pb_utils.Tensor("request_output_len", one),
                    pb_utils.Tensor("stop", np.ones((1, 1), np.bool_))])
        for _ in stop.exec(decoupled=True):
            pass

    def _detokenize(self, tokens: np.ndarray) -> bytes:
        lengths = np.full(tokens.shape[:2], tokens.shape[-1], np.int32)
        post = _exec(pb_utils.InferenceRequest(
            model_name=self.post_name, requested_output_names=["OUTPUT"],
            inputs=[pb_utils.Tensor("TOKENS_BATCH", tokens.astype(np.int32)),
                    pb_utils.Tensor("SEQUENCE_LENGTH", lengths)]))
        return pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy().reshape(-1)[0]
