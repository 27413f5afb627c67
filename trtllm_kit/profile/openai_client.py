"""The OpenAI HTTP/SSE streaming client of the load generator (``POST {base}/completions``, ``stream: true``), and
the model name a server lists at ``{base}/models``.

Its ``run(prompt, record)`` fills a ``RequestRecord`` as ``clients.py``'s Triton client does; errors never raise,
they are recorded by category.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.names import API_KEY_ENV
from trtllm_kit.profile.records import SPECULATIVE_COUNTS, RequestRecord
from trtllm_kit.profile.workload import Prompt
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.openai_body import encode_openai_body
from trtllm_kit.wire.request import NEVER_END_ID


class OpenAIStreamClient:
    """Calls ``POST {base}/completions`` with ``stream: true`` and reads server-sent events.

    A chunk's token count is ``len(choices[0].token_ids)`` when the server sends token ids, else the growth of
    ``usage.completion_tokens`` when it sends usage in every chunk (``continuous_usage_stats``, asked for), else
    1 for a chunk with non-empty text; the last ``usage.completion_tokens`` is the server's count. Servers that only
    take text prompts get the prompt's ids decoded by ``text_of`` (ISL is then the server's
    ``usage.prompt_tokens``, recorded as ``server["prompt_tokens"]``).
    """

    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0,
                 text_of: Callable[[Prompt], str] | None = None, api_key: str | None = None) -> None:
        import aiohttp

        self.base_url, self.model, self.text_of = base_url.rstrip("/"), model, text_of
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=timeout_s),
                                             headers=_auth(api_key))

    def body(self, prompt: Prompt) -> dict[str, Any]:
        """The request body: token-id prompt (or its text with ``text_of``), forced OSL
        (``GenerationRequest.with_length`` with no end token, vLLM's ``ignore_eos``), the running usage on."""
        text = self.text_of(prompt) if self.text_of else tuple(prompt.input_ids)
        req = GenerationRequest(text, end_id=NEVER_END_ID).with_length(prompt.osl)
        return encode_openai_body(req, self.model, stream=True)

    async def run(self, prompt: Prompt, record: RequestRecord) -> None:
        """Send ``prompt`` and record every SSE chunk until ``[DONE]``.

        Arguments:
            prompt: the request.
            record: filled in place.
        """
        import aiohttp

        body = json.dumps(self.body(prompt))
        record.t_send_ns = time.monotonic_ns()
        try:
            async with self.session.post(f"{self.base_url}/completions", data=body,
                                         headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    record.fail("server", f"HTTP {resp.status}: {(await resp.text())[:300]}")
                    return
                async for line in resp.content:
                    now = time.monotonic_ns()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    self._read(json.loads(data), record, now)
        except asyncio.TimeoutError:
            record.fail("timeout", "no complete response within the timeout")
        except aiohttp.ClientError as exc:
            record.fail("transport", f"{type(exc).__name__}: {exc}")
        finally:
            record.t_end_ns = time.monotonic_ns()

    @staticmethod
    def _read(event: dict[str, Any], record: RequestRecord, now: int) -> None:
        if event.get("error"):
            record.fail("server", str(event["error"])[:300])
            return
        usage = event.get("usage") or {}
        completion, before = usage.get("completion_tokens"), record.osl_server or 0
        if completion is not None:
            record.osl_server = int(completion)
            if usage.get("prompt_tokens") is not None:
                record.server["prompt_tokens"] = int(usage["prompt_tokens"])
        speculative = usage.get("speculative") or {}  # the kit's extension: counts so far, when it speculated
        for key in SPECULATIVE_COUNTS:
            if speculative.get(key) is not None:
                record.server[key] = int(speculative[key])
        for choice in event.get("choices") or []:
            ids = choice.get("token_ids")
            if ids is not None:
                count = len(ids)
            elif completion is not None:
                count = int(completion) - before
            else:
                count = int(bool(choice.get("text")))
            record.add_chunk(now, count)

    async def close(self) -> None:
        await self.session.close()


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def openai_model_name(base_url: str, api_key: str | None = None) -> str:
    """The first model id listed at ``{base}/models``.

    Arguments:
        base_url: e.g. ``http://127.0.0.1:9000/v1``.
        api_key: the bearer token, if the server wants one.
    """
    import aiohttp

    async with aiohttp.ClientSession(headers=_auth(api_key)) as session:
        try:
            async with session.get(f"{base_url.rstrip('/')}/models") as resp:
                if resp.status == 401:
                    raise KitUsageError(f"{base_url}/models answers 401: the server wants an API key; pass "
                                        f"--api-key KEY (or set {API_KEY_ENV}).")
                listing = await resp.json()
        except aiohttp.ClientError as exc:
            raise KitError(f"cannot list models at {base_url}/models ({exc}); is the server running?") from None
    models = [m.get("id") for m in listing.get("data", [])]
    if not models:
        raise KitError(f"{base_url}/models lists no model; pass --model NAME.")
    return str(models[0])
