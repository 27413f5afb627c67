"""Loading and unloading adapters on a running serve (``trtllm-kit lora load|unload``): its OpenAI frontend's
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, found from the served OUT or given as a URL."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.server.state import read_state

TIMEOUT_S = 120  # checking and converting an adapter reads its weights


def frontend_url(out: Path | None, url: str | None) -> str:
    """The OpenAI frontend's base URL: ``url``, or the one the serve of ``out`` wrote in its state.

    Arguments:
        out: a served build output, or None; url: ``http://host:port``, or None.
    """
    if url is not None:
        return url.rstrip("/")
    if out is None:
        raise KitUsageError("name the served OUT or pass --url http://HOST:PORT of its OpenAI frontend.")
    state = read_state(out)
    if state is None:
        raise KitUsageError(f"{out} is not being served; start it with trtllm-kit serve {out} --openai-port PORT.")
    if not state.get("openai"):
        raise KitUsageError(f"{out} is served without the OpenAI frontend; restart it with --openai-port PORT.")
    return f"http://{state['openai']}"


def call_adapter_endpoint(base_url: str, path: str, body: dict[str, Any], api_key: str | None) -> str:
    """POST ``body`` to ``base_url + path`` and return the answer's text; a refusal raises with the server's reason.

    Arguments:
        base_url: the frontend; path: ``/v1/load_lora_adapter`` or ``/v1/unload_lora_adapter``;
        body: the JSON body; api_key: sent as a bearer token when given (an admin key where keys are on).
    """
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode(errors="replace")
        try:
            reason = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = raw.strip() or exc.reason
        kind = KitUsageError if 400 <= exc.code < 500 else KitError
        raise kind(f"{base_url} refused {path} (HTTP {exc.code}): {reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise KitError(f"no OpenAI frontend answers at {base_url} ({exc}); is the serve running?") from None
