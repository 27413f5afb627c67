"""Every OpenAI field that evaluation and benchmark clients send, through the ``openai`` client, whole and streamed,
against one served float32 build of the tiny model: completions ``logprobs`` 0-5, ``echo`` (with ``max_tokens``
0), lists of prompts (text and token ids), ``n``/``best_of``, more than four stop strings with
``include_stop_str_in_output``, vLLM's sampling extras, ``min_tokens``, ``ignore_eos``, ``skip_special_tokens``,
structured output (validated with ``jsonschema``), chat ``logprobs``/``top_logprobs``, and a 400 naming the field
for each value out of range. ``test_stream_several_choices_*`` stream several choices in one request."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest
from serving_helpers import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "Once upon a time"
# After this prompt the float32 tiny model's greedy next token is its end of sequence (tests/data/eval/last_word.jsonl).
ENDING = "A few minutes later the train sighed and began to roll again"
# A token-id prompt after which it is the end of sequence too.
ENDING_IDS = [1, 38, 562, 603, 287, 498, 267, 422, 346, 266, 641, 651, 285, 769, 302, 447, 333, 734]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"], "additionalProperties": False}


@pytest.fixture(scope="module")
def api(served32: dict[str, Any]) -> openai.OpenAI:
    """An ``openai`` client of the session's float32 serve of the tiny model (cpu target)."""
    return openai.OpenAI(base_url=f"http://{served32['openai']}/v1", api_key="none", max_retries=0)


def complete(api: openai.OpenAI, **fields: Any) -> Any:
    """A completion of ``PROMPT`` (greedy, 6 tokens unless ``fields`` say otherwise); vLLM's fields go in the body."""
    known = ("prompt", "max_tokens", "temperature", "seed", "stop", "logprobs", "echo", "n", "best_of", "stream",
             "stream_options", "presence_penalty", "frequency_penalty")
    extra = {k: fields.pop(k) for k in list(fields) if k not in known}
    return api.completions.create(model=MODEL, **{"prompt": PROMPT, "max_tokens": 6, "temperature": 0, **fields},
                                  extra_body=extra or None)


def gathered(chunks: Any) -> dict[str, Any]:
    """One streamed completion choice put together: text, tokens, token logprobs, top logprobs, finish reason."""
    found: dict[str, Any] = {"text": "", "tokens": [], "token_logprobs": [], "top_logprobs": [], "finish": None,
                             "indexes": set()}
    for chunk in chunks:
        for choice in chunk.choices:
            found["indexes"].add(choice.index)
            found["text"] += choice.text
            if choice.logprobs is not None:
                for key in ("tokens", "token_logprobs", "top_logprobs"):
                    found[key] += getattr(choice.logprobs, key) or []
            found["finish"] = choice.finish_reason or found["finish"]
    return found


def whole_and_streamed(api: openai.OpenAI, **fields: Any) -> tuple[Any, dict[str, Any]]:
    whole = complete(api, **fields)
    streamed = gathered(complete(api, **fields, stream=True))
    assert streamed["text"] == whole.choices[0].text and streamed["finish"] == whole.choices[0].finish_reason
    return whole, streamed


@pytest.mark.parametrize("logprobs", range(6))
def test_completion_logprobs_from_0_to_5(api: openai.OpenAI, logprobs: int) -> None:
    whole, streamed = whole_and_streamed(api, logprobs=logprobs)
    found = whole.choices[0].logprobs
    assert found is not None and len(found.tokens) == len(found.token_logprobs) == len(found.top_logprobs) == 6
    assert "".join(found.tokens) == whole.choices[0].text
    assert found.text_offset[0] == 0 and found.text_offset == sorted(found.text_offset)
    assert found.text_offset[-1] <= len(whole.choices[0].text)
    for token, logprob, top in zip(found.tokens, found.token_logprobs, found.top_logprobs, strict=True):
        assert logprob <= 0 and len(top) == max(logprobs, 1)  # greedy: the k best hold it; with 0, itself alone
        if logprobs:  # greedy: the token chosen is the most likely one
            assert top[token] == pytest.approx(logprob, abs=1e-5) == max(top.values())
    assert streamed["tokens"] == found.tokens
    assert streamed["token_logprobs"] == pytest.approx(found.token_logprobs, abs=1e-5)


def test_echo_alone_and_with_logprobs(api: openai.OpenAI) -> None:
    plain, _ = whole_and_streamed(api, echo=True)
    assert plain.choices[0].text.startswith(PROMPT) and plain.choices[0].logprobs is None
    scored, streamed = whole_and_streamed(api, echo=True, logprobs=2)
    found = scored.choices[0].logprobs
    num_prompt = scored.usage.prompt_tokens
    assert len(found.tokens) == num_prompt + 6 and "".join(found.tokens) == scored.choices[0].text
    assert found.token_logprobs[0] is None and found.top_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in found.token_logprobs[1:])
    assert streamed["tokens"] == found.tokens
    assert streamed["token_logprobs"][1:] == pytest.approx(found.token_logprobs[1:], abs=1e-5)


def test_echo_with_max_tokens_0_scores_the_prompt_alone(api: openai.OpenAI) -> None:
    answer, streamed = whole_and_streamed(api, echo=True, logprobs=1, max_tokens=0)
    found = answer.choices[0].logprobs
    assert answer.choices[0].text == PROMPT and answer.usage.completion_tokens == 0
    assert len(found.tokens) == answer.usage.prompt_tokens and found.token_logprobs[0] is None
    with_one = complete(api, echo=True, logprobs=1, max_tokens=1).choices[0].logprobs
    assert with_one.token_logprobs[1:len(found.tokens)] == pytest.approx(found.token_logprobs[1:], abs=1e-5)
    assert streamed["tokens"] == found.tokens


def test_a_continuation_the_model_ends_after_keeps_its_token(api: openai.OpenAI) -> None:
    """What lm-eval's loglikelihood relies on: echo with max_tokens 1 gives prompt + 1 entries, the generated
    token included even when it is the end of sequence: scored, counted, and hidden from the text."""
    answer = complete(api, prompt=ENDING, echo=True, logprobs=1, max_tokens=1)
    assert len(answer.choices[0].logprobs.tokens) == answer.usage.prompt_tokens + 1


def test_an_end_token_generated_with_logprobs_is_scored_counted_and_hidden(api: openai.OpenAI) -> None:
    """The token-id prompt of ``ENDING_IDS`` ends on the end token at once: with echo and logprobs its entry comes
    after the prompt's, with the logprob ``ignore_eos`` gives the same token; it counts as a completion token,
    ``finish_reason`` stays ``stop``, and the text shows it only with ``skip_special_tokens`` false."""
    fields = {"prompt": [ENDING_IDS], "echo": True, "logprobs": 1, "max_tokens": 1, "seed": 1234}
    whole, streamed = whole_and_streamed(api, **fields)
    found, choice = whole.choices[0].logprobs, whole.choices[0]
    assert len(found.token_logprobs) == len(ENDING_IDS) + 1 and whole.usage.completion_tokens == 1
    assert choice.finish_reason == "stop" and choice.text == streamed["text"] and "</s>" not in choice.text
    assert found.tokens[-1] == "" and found.text_offset[-1] == len(choice.text)  # skipped, as the text skips it
    forced = complete(api, **fields, ignore_eos=True)
    assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == 1
    assert found.token_logprobs == pytest.approx(forced.choices[0].logprobs.token_logprobs, abs=1e-5)
    assert found.top_logprobs[-1] == pytest.approx({"": found.token_logprobs[-1]}, abs=1e-5)  # the most likely
    assert streamed["tokens"] == found.tokens
    assert streamed["token_logprobs"][1:] == pytest.approx(found.token_logprobs[1:], abs=1e-5)
    shown, shown_streamed = whole_and_streamed(api, **fields, skip_special_tokens=False)
    assert shown.choices[0].text.endswith("</s>") and shown.choices[0].logprobs.tokens[-1] == "</s>"
    assert shown_streamed["tokens"][-1] == "</s>" and shown.usage.completion_tokens == 1


def test_several_prompts_text_and_token_ids(api: openai.OpenAI) -> None:
    singles = [complete(api, prompt=p).choices[0].text for p in (PROMPT, "The weather")]
    answer = complete(api, prompt=[PROMPT, "The weather"])
    assert [c.index for c in answer.choices] == [0, 1] and [c.text for c in answer.choices] == singles
    ids = [[1, 45, 96], [1, 45, 96, 200]]
    by_ids = complete(api, prompt=ids, max_tokens=4)
    assert [c.text for c in by_ids.choices] == [complete(api, prompt=[i], max_tokens=4).choices[0].text for i in ids]
    assert by_ids.usage.prompt_tokens == 7


def test_n_and_best_of(api: openai.OpenAI) -> None:
    answer = complete(api, n=3, best_of=3, temperature=1.0, seed=5)
    assert [c.index for c in answer.choices] == [0, 1, 2] and len({c.text for c in answer.choices}) > 1
    assert answer.usage.completion_tokens == sum(
        complete(api, temperature=1.0, seed=5 + j).usage.completion_tokens for j in range(3))


def test_stop_strings_beyond_four_shown_or_not(api: openai.OpenAI) -> None:
    text = complete(api, max_tokens=16).choices[0].text
    stop = text[5:8]
    cut = text.find(stop)
    stops = [f"never-{i}" for i in range(6)] + [stop]
    for include, expected in ((False, text[:cut]), (True, text[:cut + len(stop)])):
        whole, _ = whole_and_streamed(api, max_tokens=16, stop=stops, include_stop_str_in_output=include)
        assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"


def test_sampling_extras_whole_and_streamed(api: openai.OpenAI) -> None:
    greedy = complete(api, max_tokens=24).choices[0].text  # long enough to repeat tokens (the penalties' object)
    sampled = {"temperature": 1.0, "seed": 9, "max_tokens": 24}
    assert complete(api, **sampled).choices[0].text != greedy
    for extra in ({"top_k": 1}, {"min_p": 1.0}):  # each keeps only the most likely token
        whole, _ = whole_and_streamed(api, **sampled, **extra)
        assert whole.choices[0].text == greedy
    for extra in ({"repetition_penalty": 1.8}, {"presence_penalty": 1.5}, {"frequency_penalty": 1.5}):
        whole, _ = whole_and_streamed(api, max_tokens=24, **extra)
        assert whole.choices[0].text != greedy
    off = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert complete(api, max_tokens=24, **off).choices[0].text == greedy


def test_min_tokens_and_ignore_eos_against_an_early_end(api: openai.OpenAI) -> None:
    ended = complete(api, prompt=ENDING, max_tokens=8)
    assert ended.usage.completion_tokens == 0 and ended.choices[0].finish_reason == "stop"
    at_least, _ = whole_and_streamed(api, prompt=ENDING, max_tokens=8, min_tokens=4)
    assert at_least.usage.completion_tokens >= 4
    ignoring, _ = whole_and_streamed(api, prompt=ENDING, max_tokens=8, ignore_eos=True)
    assert ignoring.usage.completion_tokens == 8 and ignoring.choices[0].finish_reason == "length"


def test_skip_special_tokens(api: openai.OpenAI) -> None:
    """With ignore_eos the first token after ``ENDING`` is the end of sequence: shown only when not skipped."""
    shown = {skip: whole_and_streamed(api, prompt=ENDING, max_tokens=1, logprobs=1, ignore_eos=True,
                                      skip_special_tokens=skip)[0].choices[0] for skip in (True, False)}
    assert shown[True].text == "" and shown[False].text == "</s>"
    assert shown[False].logprobs.tokens == ["</s>"]


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}},
    {"guided_json": SCHEMA},
], ids=["response_format", "guided_json"])
def test_json_schema_outputs_validate(api: openai.OpenAI, fields: dict[str, Any]) -> None:
    whole, _ = whole_and_streamed(api, max_tokens=60, temperature=1.0, seed=3, **fields)
    jsonschema.validate(json.loads(whole.choices[0].text), SCHEMA)
    chat = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "an item"}], max_tokens=60,
                                       temperature=1.0, seed=4, n=2, extra_body=fields)
    for choice in chat.choices:
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


def test_json_object_regex_choice_and_grammar(api: openai.OpenAI) -> None:
    as_object, _ = whole_and_streamed(api, max_tokens=200, response_format={"type": "json_object"})
    assert isinstance(json.loads(as_object.choices[0].text), dict)
    pattern = "[0-9]{3}-[a-z]{2}"
    assert re.fullmatch(pattern, whole_and_streamed(api, max_tokens=12, guided_regex=pattern)[0].choices[0].text)
    chosen = whole_and_streamed(api, max_tokens=8, temperature=1.0, seed=2, guided_choice=["red", "green", "blue"])
    assert chosen[0].choices[0].text in ("red", "green", "blue")
    grammar = 'root ::= "yes" | "no" | "maybe " [0-9]'
    said = whole_and_streamed(api, max_tokens=8, temperature=1.0, seed=6, guided_grammar=grammar)[0].choices[0].text
    assert re.fullmatch(r"yes|no|maybe [0-9]", said)


def test_chat_logprobs_whole_and_streamed(api: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                              "temperature": 0, "logprobs": True, "top_logprobs": 3}
    whole = api.chat.completions.create(**fields)
    content = whole.choices[0].logprobs.content
    assert len(content) == 5 and "".join(e.token for e in content) == whole.choices[0].message.content
    for entry in content:
        assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
    streamed = [e for chunk in api.chat.completions.create(**fields, stream=True) for choice in chunk.choices
                if choice.logprobs is not None for e in choice.logprobs.content or []]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)
    plain = api.chat.completions.create(**{**fields, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize(("fields", "param"), [
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"echo": "yes"}, "echo"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),  # without echo there is nothing to return
    ({"n": 0}, "n"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"temperature": 3.0}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"min_tokens": 7}, "min_tokens"),  # more than max_tokens (6)
    ({"min_tokens": -1}, "min_tokens"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"skip_special_tokens": 0}, "skip_special_tokens"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ({"stop": [1, 2]}, "stop"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else v)
def test_a_value_out_of_range_is_a_400_naming_its_field(api: openai.OpenAI, fields: dict[str, Any],
                                                        param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        complete(api, **fields)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param and body["type"] == "invalid_request_error"
    assert param in body["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
])
def test_a_chat_value_out_of_range_is_a_400_naming_its_field(api: openai.OpenAI, fields: dict[str, Any],
                                                             param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                    **{"logprobs": True, **fields})
    assert isinstance(info.value.body, dict) and info.value.body["param"] == param


def test_stream_several_choices_of_n(api: openai.OpenAI) -> None:
    fields = {"n": 2, "temperature": 1.0, "seed": 8, "logprobs": 1}
    whole = complete(api, **fields)
    chunks = list(complete(api, **fields, stream=True))
    for choice in whole.choices:
        mine = gathered([c for c in chunks if c.choices and c.choices[0].index == choice.index])
        assert mine["text"] == choice.text and mine["tokens"] == choice.logprobs.tokens
    assert gathered(chunks)["indexes"] == {0, 1}


def test_stream_several_choices_of_a_prompt_list(api: openai.OpenAI) -> None:
    prompts = [PROMPT, "The weather"]
    whole = complete(api, prompt=prompts)
    chunks = list(complete(api, prompt=prompts, stream=True))
    for choice in whole.choices:
        assert gathered([c for c in chunks if c.choices and c.choices[0].index == choice.index])["text"] == choice.text


def test_stream_several_choices_of_chat(api: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                              "temperature": 1.0, "seed": 3, "n": 2}
    whole = api.chat.completions.create(**fields)
    texts: dict[int, str] = {}
    for chunk in api.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {c.index: c.message.content for c in whole.choices}
