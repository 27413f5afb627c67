"""Chat that is right, on the real model: served through a real tritonserver and the OpenAI frontend, twenty chats
asked at once (the engine's in-flight batch) and one alone, each answer is transformers' greedy generation (both in
float32) from the same chat template, token for token, ending at the model's own end-of-turn token (``<|im_end|>``),
system messages and an earlier turn included."""

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


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat template's prompt ids, as transformers renders and tokenizes them."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]


def greedy(model: torch.nn.Module, tokenizer: Any, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuations of the prompts, generated as one batch padded on the left (masked), each up
    to and without the end-of-turn token."""
    end, width = tokenizer.eos_token_id, max(len(p) for p in prompts)
    ids = torch.tensor([[end] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=end,
                             pad_token_id=end)
    return [new[:new.index(end)] if end in new else new for new in out[:, width:].tolist()]


def test_served_chat_answers_are_transformers_greedy_answers(served: KitServer, smollm2_dir: Path) -> None:
    torch.set_num_threads(1)  # the server runs beside it on the same cores
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    client = served.client(timeout=300)
    name = client.models.list().data[0].id
    prompts = [chat_prompt(tokenizer, messages) for messages in CHATS]

    def ask(messages: list[dict[str, str]]) -> Any:
        return client.chat.completions.create(model=name, messages=messages,  # type: ignore[arg-type]
                                              max_tokens=MAX_TOKENS, temperature=0.0)

    # all chats at once on both sides: transformers' batch on one core, the server's in-flight batch on the other
    with ThreadPoolExecutor(1) as oracle, ThreadPoolExecutor(len(CHATS)) as clients:
        greedy_answers = oracle.submit(greedy, model, tokenizer, prompts)
        answers = list(clients.map(ask, CHATS))
        wants = greedy_answers.result()
    stopped = 0
    for messages, prompt, want, answer in zip(CHATS, prompts, wants, answers, strict=True):
        choice = answer.choices[0]
        assert choice.message.content == tokenizer.decode(want, skip_special_tokens=True), messages
        assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt), messages
        ended = len(want) < MAX_TOKENS
        assert choice.finish_reason == ("stop" if ended else "length"), messages
        stopped += ended
    assert stopped >= len(CHATS) // 2  # most answers end at <|im_end|>, not at the token limit
    first = client.chat.completions.create(model=name, messages=CHATS[0], max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                           temperature=0.0)
    assert first.choices[0].message.content == "The capital of France is Paris."
