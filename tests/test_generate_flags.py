"""``generate``'s sampling flags come from the generation request's rows, and reach the request it sends."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

import trtllm_kit.serve.client as client
import trtllm_kit.serve.server.state as state
from trtllm_kit.cli import cli
from trtllm_kit.wire import GenerationRequest


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[GenerationRequest]:
    requests: list[GenerationRequest] = []

    async def generate_to(url: str, model: str | None, request: GenerationRequest, *_: Any) -> None:
        requests.append(request)

    monkeypatch.setattr(client, "generate_to", generate_to)
    monkeypatch.setattr(state, "token_for", lambda url: None)
    return requests


@pytest.mark.parametrize(("flags", "expected"), [
    ((), {"temperature": None, "top_k": None, "top_p": None, "min_tokens": None}),
    (("--temperature", "0", "--top-p", "0.9"), {"temperature": None, "top_k": 1, "top_p": None}),
    (("--temperature", "0.7", "--top-k", "5", "--top-p", "0.9"), {"temperature": 0.7, "top_k": 5, "top_p": 0.9}),
    (("--min-tokens", "3", "--presence-penalty", "0.5", "--seed", "7"),
     {"min_tokens": 3, "presence_penalty": 0.5, "seed": 7, "frequency_penalty": None}),
])
def test_the_flags_set_the_request_fields(sent: list[GenerationRequest], flags: tuple[str, ...],
                                          expected: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["generate", "hi", "--max-tokens", "4", *flags])
    assert result.exit_code == 0, result.output
    (request,) = sent
    assert request.max_tokens == 4
    assert {name: getattr(request, name) for name in expected} == expected


def test_a_bad_value_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["generate", "hi", "--top-k", "two"])
    assert result.exit_code == 2 and "'--top-k': 'two' is not a valid integer" in result.output


def test_the_cli_help_imports_no_numpy() -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "trtllm_kit", "--help"], capture_output=True,
                          text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "generate" in done.stdout and "trtllm_kit.cli" in imported and "numpy" not in imported
