"""The llmapi model's responses, without Triton: the LLM API's completions as the wire's responses, encoded as the
model sends them."""

from __future__ import annotations

from types import SimpleNamespace

from trtllm_kit.llmapi.cpu_types import CompletionOutput, Logprob
from trtllm_kit.llmapi.disaggregated_params import DisaggregatedParams
from trtllm_kit.triton_models.llmapi_outputs import completion_responses, scored_of
from trtllm_kit.wire import DisaggHandle, GenerationRequest
from trtllm_kit.wire.llmapi_response import encode_llmapi_response

PROMPT = [5, 6, 7]


def output(*completions: CompletionOutput) -> SimpleNamespace:
    return SimpleNamespace(prompt_token_ids=PROMPT, outputs=list(completions))


def test_without_n_one_response_carries_every_completion() -> None:
    req = GenerationRequest(tuple(PROMPT), 4, return_finish_reason=True, return_cumulative_logprob=True)
    done = output(CompletionOutput(0, "ab", [1, 2], "length", cumulative_logprob=-1.5),
                  CompletionOutput(1, "c", [3], "stop"))
    [response] = completion_responses(req, done, diff=False, reported=set())
    assert (response.texts, response.token_ids, response.sequence_index) == (("ab", "c"), (1, 2), None)
    assert (response.num_input_tokens, response.num_output_tokens) == (3, 2)
    assert response.finish_reasons == ("length", "stop") and response.cum_logprobs == (-1.5, 0.0)
    assert response.stop_reasons == () and response.scored is None
    arrays = encode_llmapi_response(response)
    assert set(arrays) == {"text_output", "output_ids", "num_input_tokens", "num_output_tokens", "finish_reason",
                           "cumulative_logprob"}


def test_with_n_each_changed_completion_is_its_own_indexed_response() -> None:
    req = GenerationRequest(tuple(PROMPT), 4, n=2, streaming=True, return_finish_reason=True)
    reported: set[int] = set()
    step = output(CompletionOutput(0, "ab", [1, 2], "length", text_diff="b", token_ids_diff=[2]),
                  CompletionOutput(1, "c", [3], None))  # nothing new for completion 1
    [response] = completion_responses(req, step, diff=True, reported=reported)
    assert (response.sequence_index, response.token_ids, response.texts) == (0, (2,), ("b",))
    assert response.finish_reasons == ("length",) and reported == {0}
    last = output(CompletionOutput(0, "ab", [1, 2], "length"), CompletionOutput(1, "c", [3], "stop"))
    [finished] = completion_responses(req, last, diff=True, reported=reported)  # finished, no new token: once
    assert (finished.sequence_index, finished.token_ids, finished.finish_reasons) == (1, (), ("stop",))
    assert completion_responses(req, last, diff=True, reported=reported) == []


def test_logprobs_keep_the_ranked_alternatives_and_the_prompt_comes_first_only() -> None:
    req = GenerationRequest(tuple(PROMPT), 4, n=1, streaming=True, logprobs=1, prompt_logprobs=2)
    sampled = {9: Logprob(-0.5, 1), 4: Logprob(-1.0, 2)}
    unranked = {3: Logprob(-0.25, 1), 8: Logprob(-3.0, 7)}  # the sampled token 8 is ranked 7th
    prompt = [{6: Logprob(-2.0, 3), 1: Logprob(-0.1, 1), 2: Logprob(-0.2, 2)}, {7: Logprob(-1.0, 1)}]
    first = output(CompletionOutput(0, "xy", [9, 8], None, logprobs=[sampled, unranked], prompt_logprobs=prompt,
                                    token_ids_diff=[9, 8], logprobs_diff=[sampled, unranked]))
    [response] = completion_responses(req, first, diff=True, reported=set())
    assert response.scored == ((9, -0.5, ((9, -0.5),)), (8, -3.0, ((3, -0.25),)))
    assert response.prompt_scored == ((5, None, ()), (6, -2.0, ((1, -0.1), (2, -0.2))), (7, -1.0, ((7, -1.0),)))
    arrays = encode_llmapi_response(response)
    assert arrays["top_log_prob_ids"].tolist() == [[9], [3]]
    assert arrays["prompt_top_log_prob_ids"].tolist() == [[-1, -1], [1, 2], [7, -1]]
    later = output(CompletionOutput(0, "xyz", [9, 8, 4], None, logprobs=[sampled, unranked, {}],
                                    prompt_logprobs=prompt, token_ids_diff=[4], logprobs_diff=[{}]))
    [next_response] = completion_responses(req, later, diff=True, reported=set())
    assert next_response.prompt_scored is None and next_response.scored == ((4, None, ()),)


def test_scored_tokens_without_a_dict_have_no_logprob() -> None:
    assert scored_of([None, {}], [1, 2], 3) == ((1, None, ()), (2, None, ()))


def test_a_context_only_completion_returns_its_handle() -> None:
    params = DisaggregatedParams(request_type="context_only", first_gen_tokens=[4], ctx_request_id=9,
                                 opaque_state=b"state")
    done = output(CompletionOutput(0, "a", [4], "length", disaggregated_params=params))
    [response] = completion_responses(GenerationRequest(tuple(PROMPT), 1), done, diff=False, reported=set())
    assert response.disaggregated == DisaggHandle(request_type="context_only", first_gen_tokens=(4,),
                                                  ctx_request_id=9, opaque_state=b"state")
