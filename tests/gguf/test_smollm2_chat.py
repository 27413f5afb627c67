"""Chat that is right, on the real model: served through a real tritonserver and the OpenAI frontend, each answer
is transformers' greedy generation (both in float32) from the same chat template, token for token, ending at the
model's own end-of-turn token (``<|im_end|>``), system messages and an earlier turn included."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf_files import SMOLLM2
from kit_server import BuildKey, KitServer, Servers
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MAX_TOKENS = 40
CHATS: list[list[dict[str, str]]] = [
    *([{"role": "user", "content": question}] for question in (
        "What is the capital of France?", "Name three primary colors.", "What is 12 plus 7?",
        "Write one sentence about the sea.", "Who wrote Romeo and Juliet?", "What do bees make?",
        "Give me a synonym for happy.", "How many days are in a week?", "What is the boiling point of water?",
        "Translate 'thank you' into French.", "What is the largest planet in our solar system?",
        "Suggest a name for a pet goldfish.", "What color is the sky on a clear day?",
        "List two fruits that are yellow.", "Why do we need sleep?")),
    [{"role": "system", "content": "You are a pirate. Answer like one."}, {"role": "user", "content": "Say hello."}],
    [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "What animal barks?"}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "What is 2 times 3?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is rain?"}],
    [{"role": "user", "content": "Complete the phrase: an apple a day"}],
]


@pytest.fixture(scope="module")
def served(kit_servers: Servers, smollm2_dir: Path) -> KitServer:
    return kit_servers.get(BuildKey.of(SMOLLM2, target="cpu", dtype="float32"),  # transformers' precision below
                           ready_timeout_s=300)


def greedy(model: torch.nn.Module, tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """transformers' greedy continuation of the chat prompt, up to and without the end-of-turn token."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    return new[:new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new


def test_served_chat_answers_are_transformers_greedy_answers(served: KitServer, smollm2_dir: Path) -> None:
    torch.set_num_threads(1)  # the server runs beside it on the same cores
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    client = served.client(timeout=300)
    name = client.models.list().data[0].id
    with ThreadPoolExecutor(1) as oracle:  # transformers answers on one core while the server answers on the other
        greedy_answers = oracle.map(lambda messages: greedy(model, tokenizer, messages), CHATS)
        answers = [client.chat.completions.create(model=name, messages=messages,  # type: ignore[arg-type]
                                                  max_tokens=MAX_TOKENS, temperature=0.0) for messages in CHATS]
        wants = list(greedy_answers)  # the tokenizer is the oracle's alone until it is done
    stopped = 0
    for messages, want, answer in zip(CHATS, wants, answers, strict=True):
        choice = answer.choices[0]
        assert choice.message.content == tokenizer.decode(want, skip_special_tokens=True), messages
        assert answer.usage is not None and answer.usage.prompt_tokens == len(tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        ended = len(want) < MAX_TOKENS
        assert choice.finish_reason == ("stop" if ended else "length"), messages
        stopped += ended
    assert stopped >= len(CHATS) // 2  # most answers end at <|im_end|>, not at the token limit
    first = client.chat.completions.create(model=name, messages=CHATS[0], max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                           temperature=0.0)
    assert first.choices[0].message.content == "The capital of France is Paris."
