"""A model error's code at the head of its message: marked once, read back, and a message without a mark has none."""

from __future__ import annotations

import pytest

from trtllm_kit.wire.error_code import CODES, split_code, with_code


@pytest.mark.parametrize("code", CODES)
def test_a_marked_message_gives_back_its_code_and_sentence(code: str) -> None:
    assert split_code(with_code("input beam_width = 2 is not supported.", code)) == (
        code, "input beam_width = 2 is not supported.")


def test_marking_a_marked_message_replaces_its_mark() -> None:
    inner = with_code("the queue is full.", "UNAVAILABLE")
    assert with_code(inner, "INTERNAL") == "[INTERNAL] the queue is full."


@pytest.mark.parametrize("message", [
    "Request for unknown model: 'x' is not found",
    "[NOT_A_CODE] the sentence",
    "[INVALID_ARG]no space",
    "the sentence [INVALID_ARG] in the middle",
    "",
])
def test_a_message_without_a_mark_has_no_code(message: str) -> None:
    assert split_code(message) == (None, message)
