"""The response codecs: every output round-trips in both dialects; what the CPU model sends (the runtime's
``response_of``, encoded) reads back as the sequence's own logprobs, and the scored tokens are the ones the client read
before it decoded with the wire (``old_reading`` below)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.wire.values import batched
from trtllm_kit.runtime.response import response_of
from trtllm_kit.runtime.sequence import SamplingParams, Sequence, TokenLogprob
from trtllm_kit.wire import DisaggHandle, GenerationRequest, GenerationResponse, Perf, WireError
from trtllm_kit.wire.llmapi_response import decode_llmapi_response, encode_llmapi_response
from trtllm_kit.wire.trtllm_response import decode_trtllm_response, encode_trtllm_response

PROMPT = (3, 8, 1)
SCORED = ((11, -0.5, ((11, -0.5), (4, -1.25))), (12, -2.0, ((7, -0.75), (12, -2.0))))
PROMPT_SCORED = ((3, None, ()), (8, -1.5, ((8, -1.5), (2, -2.5))), (1, -0.25, ((1, -0.25), (5, -3.0))))


def full(**changes) -> GenerationResponse:
    values = dict(token_ids=(11, 12), sequence_index=1, num_input_tokens=3, num_output_tokens=2, cum_logprobs=(-2.5,),
                  num_top=2, scored=SCORED, prompt_scored=PROMPT_SCORED)
    return GenerationResponse(**{**values, **changes})


def test_a_tensorrt_llm_response_round_trips() -> None:
    response = full(context_logits=np.arange(12, dtype=np.float32).reshape(3, 4),
                    generation_logits=np.ones((2, 4), np.float32), perf=Perf(1, 2, 3, 0, 1, 1))
    arrays = encode_trtllm_response(response)
    assert arrays["output_ids"].shape == (1, 2) and arrays["top_log_probs"].shape == (1, 2, 2)
    assert arrays["prompt_top_log_prob_ids"].tolist()[0] == [-1, -1]  # the first prompt token has no alternatives
    assert decode_trtllm_response(arrays, PROMPT) == response == decode_trtllm_response(batched(arrays), PROMPT)
    assert decode_trtllm_response(arrays).prompt_scored is None  # without the prompt, its logprobs are not read
    plain = GenerationResponse(token_ids=(4,))
    assert set(encode_trtllm_response(plain)) == {"output_ids", "sequence_length"}
    assert decode_trtllm_response(encode_trtllm_response(plain)) == plain


def test_an_llmapi_response_round_trips() -> None:
    response = full(texts=("ab",), finish_reasons=("length",), stop_reasons=("None",),
                    disaggregated=DisaggHandle(request_type="context_only", first_gen_tokens=(11,), opaque_state=b"x"))
    arrays = encode_llmapi_response(response)
    assert arrays["output_ids"].shape == (2,) and arrays["top_log_probs"].shape == (2, 2)
    assert decode_llmapi_response(arrays, PROMPT) == response
    bare = encode_llmapi_response(GenerationResponse(texts=("N/A",)))
    assert set(bare) == {"text_output", "output_ids"} and bare["output_ids"].shape == (0,)


def test_an_llmapi_response_counts_prompt_alternatives_apart() -> None:
    """The LLM API asks for logprobs and prompt_logprobs apart: each table has its own count of alternatives."""
    prompt_one = tuple((t, v, alternatives[:1]) for t, v, alternatives in PROMPT_SCORED)
    response = full(num_prompt_top=1, prompt_scored=prompt_one)
    arrays = encode_llmapi_response(response)
    assert arrays["top_log_prob_ids"].shape == (2, 2) and arrays["prompt_top_log_prob_ids"].shape == (3, 1)
    assert decode_llmapi_response(arrays, PROMPT) == response
    assert decode_llmapi_response(encode_llmapi_response(full()), PROMPT).num_prompt_top is None


def test_sequence_length_cuts_padded_output_ids() -> None:
    arrays = {"output_ids": np.array([[[5, 6, 0, 0]]], np.int32), "sequence_length": np.array([[2]], np.int32)}
    assert decode_trtllm_response(arrays).token_ids == (5, 6)


def test_too_few_logprobs_are_refused_naming_the_tensor() -> None:
    arrays = {"output_ids": np.array([[5, 6]], np.int32), "output_log_probs": np.array([[-1.0]], np.float32)}
    with pytest.raises(WireError, match=r"^output_log_probs holds 1 logprobs for 2 tokens; a response scores every "
                                        r"token it carries\.$"):
        decode_trtllm_response(arrays)


def _entry(token: int, logprob: float, alternatives: tuple[tuple[int, float], ...]) -> TokenLogprob:
    return TokenLogprob(token, logprob, 1, tuple(t for t, _ in alternatives), tuple(v for _, v in alternatives))


def test_what_the_cpu_model_sends_reads_back_as_the_sequence() -> None:
    """``response_of`` (the CPU model's response), encoded with the batch dimension, decodes to the sequence's
    logprobs, alternatives and logits."""
    params = SamplingParams(max_tokens=4, logprobs=2, prompt_logprobs=2, return_context_logits=True,
                            return_generation_logits=True)
    seq = Sequence(0, list(PROMPT), params)
    seq.token_ids += [11, 12]
    seq.output_logprobs = [_entry(t, lp, alt) for t, lp, alt in SCORED]
    seq.prompt_logprobs = [None, *(_entry(t, lp, alt) for t, lp, alt in PROMPT_SCORED[1:])]
    seq.cum_logprob = -2.5
    seq.context_logits = [torch.full((4,), float(i)) for i in range(3)]
    seq.generation_logits = [torch.full((4,), 9.0) for _ in range(2)]
    req = GenerationRequest(PROMPT, 4, logprobs=2, prompt_logprobs=2, return_context_logits=True,
                            return_generation_logits=True)
    sent = response_of(seq, req, [11, 12], 0, with_prompt=True)
    response = decode_trtllm_response(batched(encode_trtllm_response(sent)), PROMPT)
    assert response.scored == SCORED and response.prompt_scored == PROMPT_SCORED
    assert response.cum_logprobs == (-2.5,) and response.num_top == 2
    assert response.context_logits is not None and response.context_logits[:, 0].tolist() == [0.0, 1.0, 2.0]
    assert response.generation_logits is not None and response.generation_logits.shape == (2, 4)
    assert response == sent  # nothing lost on the way


def old_reading(arrays: dict[str, np.ndarray], prefix: str, token_ids: tuple[int, ...]) -> tuple:
    """How the client read the logprob outputs before the wire: the last ``len(token_ids)`` rows, every alternative
    kept, the first prompt token unscored."""
    logprobs = arrays[f"{prefix or 'output_'}log_probs"].reshape(-1)[-len(token_ids):]
    top_ids, top_logprobs = arrays[f"{prefix}top_log_prob_ids"], arrays[f"{prefix}top_log_probs"]
    width = top_ids.shape[-1]
    top_ids, top_logprobs = (a.reshape(-1, width)[-len(token_ids):] for a in (top_ids, top_logprobs))
    return tuple((token, None, ()) if prefix and i == 0 else
                 (token, float(logprobs[i]), tuple((int(a), float(b)) for a, b in zip(top_ids[i], top_logprobs[i],
                                                                                       strict=True)))
                 for i, token in enumerate(token_ids))


def test_the_scored_tokens_are_the_ones_the_client_read_before_the_wire() -> None:
    arrays = batched(encode_trtllm_response(full()))
    response = decode_trtllm_response(arrays, PROMPT)
    assert response.scored == old_reading(arrays, "", response.token_ids)
    assert response.prompt_scored == old_reading(arrays, "prompt_", PROMPT)
