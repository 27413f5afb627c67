"""Dynamo's PreprocessedRequest as the CPU LLM's request: what maps, what is refused, and the chunks back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.cpu_types import Logprob
from trtllm_kit.serve.dynamo.card import card_config, write_card
from trtllm_kit.serve.dynamo.request import (
    LOGPROBS_ANNOTATION,
    PROMPT_LOGPROBS_ANNOTATION,
    DynamoRequestError,
    prompt_scored,
    response_chunk,
    worker_request,
)

# a request as Dynamo 1.6's frontend sends it for a /v1/completions call (observed)
OBSERVED = {"model": "tiny", "token_ids": [264, 333, 84, 534, 332],
            "stop_conditions": {"max_tokens": 3, "stop": ["x"], "stop_token_ids": None,
                                "stop_token_ids_visible": None, "stop_token_ids_hidden": [2], "min_tokens": None,
                                "ignore_eos": None, "max_thinking_tokens": None},
            "sampling_options": {"n": None, "best_of": None, "presence_penalty": None, "frequency_penalty": None,
                                 "repetition_penalty": None, "temperature": 0.0, "top_p": None, "top_k": None,
                                 "min_p": None, "use_beam_search": None, "length_penalty": None, "seed": 4,
                                 "include_stop_str_in_output": None, "guided_decoding": None},
            "output_options": {"logprobs": None, "prompt_logprobs": None, "skip_special_tokens": None,
                               "formatted_prompt": None, "return_tokens_as_token_ids": None},
            "eos_token_ids": [2], "annotations": [], "routing": {"dp_rank": 0}}


def _with(section: str, **values: object) -> dict:
    return {**OBSERVED, section: {**OBSERVED[section], **values}}  # type: ignore[dict-item]


def test_observed_request_maps_onto_sampling_params() -> None:
    asked = worker_request(OBSERVED, max_seq_len=1024)
    assert asked.token_ids == [264, 333, 84, 534, 332]
    p = asked.sampling
    assert (p.max_tokens, p.temperature, p.seed, p.end_id, p.ignore_eos) == (3, 0.0, 4, 2, False)
    assert (p.top_k, p.top_p, p.repetition_penalty, p.presence_penalty, p.n) == (None, None, None, 0.0, 1)
    assert p.stop is None  # stop strings are the frontend's: it matches them on the text it detokenizes


def test_penalties_min_tokens_and_ignore_eos_map() -> None:
    request = _with("sampling_options", top_k=5, top_p=0.9, min_p=0.1, repetition_penalty=1.2,
                    presence_penalty=0.5, frequency_penalty=0.25)
    request["stop_conditions"] = {**OBSERVED["stop_conditions"], "min_tokens": 2, "ignore_eos": True}
    p = worker_request(request, max_seq_len=1024).sampling
    assert (p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (5, 0.9, 0.1, 1.2)
    assert (p.presence_penalty, p.frequency_penalty, p.min_tokens, p.ignore_eos) == (0.5, 0.25, 2, True)


def test_sampling_options_map_by_the_wires_field_names() -> None:
    # include_stop_str_in_output is a wire field Dynamo sends under the same name: it reaches SamplingParams
    p = worker_request(_with("sampling_options", include_stop_str_in_output=True, use_beam_search=False),
                       max_seq_len=64).sampling
    assert p.include_stop_str_in_output is True


def test_a_sampling_option_the_wire_does_not_know_is_refused_not_dropped() -> None:
    with pytest.raises(DynamoRequestError) as caught:
        worker_request(_with("sampling_options", typical_p=0.5), max_seq_len=64)
    assert str(caught.value) == ("sampling_options.typical_p is 0.5; the CPU runtime has no such setting: "
                                 "leave it out.")


def test_missing_max_tokens_fills_the_context() -> None:
    assert worker_request(_with("stop_conditions", max_tokens=None), max_seq_len=64).sampling.max_tokens == 59


def test_guided_decoding_json_maps_and_choice_is_refused() -> None:
    p = worker_request(_with("sampling_options", guided_decoding={"json": {"type": "object"}, "backend": None}),
                       max_seq_len=64).sampling
    assert p.guided_decoding is not None and p.guided_decoding.json == {"type": "object"}
    with pytest.raises(DynamoRequestError, match=r"guided_decoding\.choice is set"):
        worker_request(_with("sampling_options", guided_decoding={"choice": ["a", "b"]}), max_seq_len=64)


@pytest.mark.parametrize("section, values, message", [
    ("sampling_options", {"n": 2}, "sampling_options.n is 2; serve --dynamo answers one choice per request"),
    ("sampling_options", {"best_of": 3}, "sampling_options.best_of is 3;"),
    ("sampling_options", {"use_beam_search": True}, "sampling_options.use_beam_search is True; serve --dynamo "
                                                    "decodes without beams."),
    ("sampling_options", {"length_penalty": 0.5}, "sampling_options.length_penalty is 0.5;"),
    ("output_options", {"prompt_logprobs": 1}, "output_options.prompt_logprobs is 1; Dynamo's frontend returns no "
                                               "prompt logprobs; ask serve --dynamo's OpenAI port for echo with "
                                               "logprobs."),
    ("stop_conditions", {"max_thinking_tokens": 8}, "stop_conditions.max_thinking_tokens is 8; the CPU runtime "
                                                    "has no thinking budget."),
])
def test_refusals_name_the_field_and_value(section: str, values: dict, message: str) -> None:
    with pytest.raises(DynamoRequestError) as caught:
        worker_request(_with(section, **values), max_seq_len=1024)
    assert str(caught.value).startswith(message)
    assert isinstance(caught.value, KitUsageError)


def test_prompt_filling_the_context_and_empty_prompt_are_refused() -> None:
    with pytest.raises(DynamoRequestError, match="the prompt has 5 tokens and max_seq_len is 5; shorten"):
        worker_request(OBSERVED, max_seq_len=5)
    with pytest.raises(DynamoRequestError, match="token_ids is empty"):
        worker_request({**OBSERVED, "token_ids": []}, max_seq_len=64)


def test_logprobs_map_and_the_kits_annotation_asks_beyond_the_frontends_bound() -> None:
    unscored, scored = (worker_request(_with("output_options", logprobs=k), max_seq_len=64).sampling
                        for k in (None, 0))
    assert (unscored.logprobs, unscored.keep_end_token) == (None, False)
    assert (scored.logprobs, scored.keep_end_token) == (0, True)  # the end token comes with its logprob
    annotated = {**_with("output_options", logprobs=5), "annotations": ["other", f"{LOGPROBS_ANNOTATION}20"]}
    assert worker_request(annotated, max_seq_len=64).sampling.logprobs == 20


@pytest.mark.parametrize("value", ["21", "-1", "x"])
def test_an_annotation_asking_for_too_many_alternatives_is_refused(value: str) -> None:
    with pytest.raises(DynamoRequestError) as caught:
        worker_request({**OBSERVED, "annotations": [f"{LOGPROBS_ANNOTATION}{value}"]}, max_seq_len=64)
    assert str(caught.value) == (f"the annotation '{LOGPROBS_ANNOTATION}{value}' asks for '{value}' alternatives "
                                 f"per token; send {LOGPROBS_ANNOTATION}N with N from 0 to 20.")


def test_chunks_carry_the_tokens_logprobs_and_alternatives_by_rank() -> None:
    scored = ((7, -0.5, ((7, -0.5), (9, -1.25))), (8, -2.0, ((3, -1.0),)))
    assert response_chunk([7, 8], None, 5, 2, scored) == {
        "token_ids": [7, 8], "index": 0, "log_probs": [-0.5, -2.0],
        "top_logprobs": [[{"rank": 1, "token_id": 7, "token": None, "logprob": -0.5},
                          {"rank": 2, "token_id": 9, "token": None, "logprob": -1.25}],
                         [{"rank": 1, "token_id": 3, "token": None, "logprob": -1.0}]]}


def test_the_prompts_logprobs_are_asked_by_annotation_and_sent_aligned_on_its_last_token() -> None:
    asked = worker_request({**OBSERVED, "annotations": [f"{PROMPT_LOGPROBS_ANNOTATION}1"]}, max_seq_len=64)
    assert asked.sampling.prompt_logprobs == 1 and asked.sampling.logprobs is None
    entries = [{333: Logprob(-1.5, 2), 7: Logprob(-0.5, 1)}, {84: Logprob(-3.0, 1)}]  # the last two positions
    scored = prompt_scored(entries, [1, 333, 84], 1)
    assert scored == ((1, None, ()), (333, -1.5, ((7, -0.5),)), (84, -3.0, ((84, -3.0),)))
    assert response_chunk([9], None, 3, 1, prompt=scored)["engine_data"] == {
        "prompt_scored": [[1, None, []], [333, -1.5, [[7, -0.5]]], [84, -3.0, [[84, -3.0]]]]}


def test_chunks_carry_usage_only_when_finished() -> None:
    assert response_chunk([7, 8], None, 5, 2) == {"token_ids": [7, 8], "index": 0}
    assert response_chunk([], "stop", 5, 3) == {
        "token_ids": [], "index": 0, "finish_reason": "stop",
        "completion_usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}


def test_card_config_from_a_trtllm_checkpoint_and_unchanged_for_hf() -> None:
    trtllm = {"architecture": "LlamaForCausalLM", "dtype": "bfloat16", "vocab_size": 1031,
              "max_position_embeddings": 1024, "hidden_size": 256, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_size": 64}
    assert card_config(trtllm) == {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                   "max_position_embeddings": 1024,
                                   "vocab_size": 1031, "hidden_size": 256, "num_hidden_layers": 3,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "torch_dtype": "bfloat16"}
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    assert card_config(hf) is hf
    with pytest.raises(KitUsageError, match="names no architecture"):
        card_config({"dtype": "float16"})


def test_write_card_links_the_tokenizer_and_writes_the_config(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "tokenizer").mkdir(parents=True)
    (out / "checkpoint").mkdir()
    (out / "tokenizer" / "tokenizer.json").write_text("{}")
    (out / "checkpoint" / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM"}))
    card = write_card(out, tmp_path / "card")
    assert (card / "tokenizer.json").resolve() == (out / "tokenizer" / "tokenizer.json").resolve()
    assert json.loads((card / "config.json").read_text()) == {"architectures": ["LlamaForCausalLM"],
                                                              "model_type": "llama"}
    with pytest.raises(KitUsageError, match="has no tokenizer/ directory"):
        write_card(tmp_path / "missing", tmp_path / "card2")
