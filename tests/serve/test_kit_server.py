"""The tests' shared server (``tests/kit_server.py``): one running server per build and serve settings, a raw
``post`` and an ``openai`` client of it."""

from __future__ import annotations

import json

import pytest
from kit_server import BuildKey, Servers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_one_server_per_build_and_settings(kit_servers: Servers) -> None:
    server = kit_servers.get(BuildKey.of(), ensemble=True)
    assert kit_servers.get(BuildKey.of(), ensemble=True) is server
    assert kit_servers.builds.get(BuildKey()) == kit_servers.builds.get(BuildKey.of())  # one build of one key
    assert (server.out / "manifest.json").is_file()
    status, _, body = server.post("/v1/completions", json.dumps({"model": "builtin:tiny-llama", "prompt": "Hi",
                                                                 "max_tokens": 3, "ignore_eos": True}).encode())
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 3
    done = server.client().completions.create(model="builtin:tiny-llama", prompt="Hi", max_tokens=2,
                                              extra_body={"ignore_eos": True})
    assert done.usage is not None and done.usage.completion_tokens == 2
