"""The two OpenAI requests the frontend serves, as typed classes (``sampling_fields.OpenAIRequest`` holds what they
share): ``CompletionRequest`` (``/v1/completions``: prompts, ``logprobs``, ``echo``) and ``ChatRequest``
(``/v1/chat/completions``: messages, ``logprobs``, ``top_logprobs``). Each is parsed once at its handler
(``CompletionRequest.parse(body, ...)``); nothing after the parse reads the body."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.logprobs import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS, Scoring
from trtllm_kit.serve.openai.refusals import FLAG, Sentences
from trtllm_kit.serve.openai.request_limits import MAX_PROMPTS
from trtllm_kit.serve.openai.sampling_fields import Int, OpenAIRequest, Prompt

PROMPT = "{name} must be a string or a list of token ids (or a list of them), got {value!r:.60}."


class CompletionRequest(OpenAIRequest):
    """``/v1/completions``: its prompts (text or token ids, up to ``MAX_PROMPTS``), ``logprobs`` and ``echo``."""

    kind: ClassVar[str] = "text_completion"
    prompt: str | list[Int] | list[str | list[Int]] | None = None
    logprobs: Int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    # copied per instance; pydantic reads a default_factory's signature on every instance (1 ms for ``list``)
    _prompts: list[Prompt] = PrivateAttr(default=[])
    sentences: ClassVar[Sentences] = {
        **OpenAIRequest.sentences, "prompt": (PROMPT, None), "echo": (FLAG, None),
        "logprobs": (f"{{name}} must be an integer from 0 to {MAX_COMPLETION_LOGPROBS}, got {{value!r:.60}}.", None)}

    @property
    def scoring(self) -> Scoring:
        return Scoring(self.logprobs, self.echo)

    @property
    def prompts(self) -> list[Prompt]:
        """The prompts, each text or a tuple of token ids."""
        return self._prompts

    def _check_endpoint(self, vocab_size: int | None) -> None:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):  # a list of prompts
            if len(prompt) > MAX_PROMPTS:
                raise HTTPError(f"prompt is a list of {len(prompt)} prompts; at most {MAX_PROMPTS} are allowed per "
                                "request: split it.", param="prompt")
            self._prompts = [_one_prompt(p, vocab_size) for p in prompt]
        else:
            self._prompts = [_one_prompt(prompt, vocab_size)]


class Message(BaseModel):
    """One chat message: its role and content (text, or text parts; the chat template reads them)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    role: str
    content: Any = None


class ChatRequest(OpenAIRequest):
    """``/v1/chat/completions``: its messages, ``logprobs`` and ``top_logprobs``."""

    kind: ClassVar[str] = "chat.completion"
    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    sentences: ClassVar[Sentences] = {
        **OpenAIRequest.sentences, "logprobs": (FLAG, None),
        "messages": ("{name} must be a non-empty list of {{role, content}} objects.", None),
        "top_logprobs": (f"{{name}} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {{value!r:.60}}.", None)}

    @property
    def scoring(self) -> Scoring:
        return Scoring(self.top_logprobs or 0) if self.logprobs else Scoring()

    @property
    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    def _check_endpoint(self, vocab_size: int | None) -> None:
        if self.top_logprobs is not None and not self.logprobs:
            raise HTTPError("top_logprobs needs logprobs set to true.", param="top_logprobs")


def _one_prompt(prompt: Any, vocab_size: int | None) -> Prompt:
    if isinstance(prompt, str):
        if not prompt:
            raise HTTPError("prompt is empty; send at least one character.", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        bad = [t for t in prompt if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise HTTPError(f"token ids must be in [0, {vocab_size}) (the tokenizer's vocabulary), got {bad[0]}.",
                            param="prompt")
        return tuple(prompt)
    raise HTTPError(PROMPT.format(name="prompt", value=prompt), param="prompt")
