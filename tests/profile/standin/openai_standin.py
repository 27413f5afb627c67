"""An OpenAI-compatible ``/v1/completions`` server that streams ``max_tokens`` tokens at a fixed pace (SSE),
with ``usage`` in the last chunk. ``python openai_standin.py --port P --token-delay-ms 20``."""

import argparse
import asyncio
import json
import time

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--first-token-delay-ms", type=float, default=0)
    parser.add_argument("--token-delay-ms", type=float, default=0)
    args = parser.parse_args()

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "standin", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt, osl = body["prompt"], int(body.get("max_tokens") or body["max_completion_tokens"])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        start = time.monotonic()
        for k in range(osl):
            due = start + (args.first_token_delay_ms + k * args.token_delay_ms) / 1000
            if (left := due - time.monotonic()) > 0:
                await asyncio.sleep(left)
            chunk = {"id": "c", "object": "text_completion", "model": body["model"],
                     "choices": [{"index": 0, "text": f" t{k}", "finish_reason": "length" if k == osl - 1 else None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": len(prompt), "completion_tokens": osl, "total_tokens": len(prompt) + osl}
        await response.write(f"data: {json.dumps({'id': 'c', 'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", completions)])
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
