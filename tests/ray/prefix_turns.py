"""What the routing tests share: turns of prompts that share a first KV block per prefix, and which replicas served
each prefix, read from the replicas' logs."""

from __future__ import annotations

import json
from pathlib import Path

from kit_server import KitServer

from trtllm_kit.serve.ray.engine_load import ENDED, replica_logs
from trtllm_kit.serve.ray.prefix import prefix_key

TOKENS_PER_BLOCK = 32  # the tiny build's KV cache block
PREFIXES = (tuple(range(100, 100 + TOKENS_PER_BLOCK)), tuple(range(500, 500 + TOKENS_PER_BLOCK)))


def replicas_by_prefix(server: KitServer, num_turns: int, headers: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Send ``num_turns`` turns of one two-token completion per prefix (BOS, the prefix, a token of the turn), one
    after the other; the replicas (their logs' names) that served each prefix's key.

    Arguments:
        server: a ``serve --ray``; num_turns: turns; headers: more headers (a key).
    """
    prompts = [[1, *prefix] for prefix in PREFIXES]
    keys = [prefix_key(prompt, TOKENS_PER_BLOCK) for prompt in prompts]
    for turn in range(num_turns):
        for prompt in prompts:
            body = {"model": server.state["model"], "prompt": [*prompt, 7 + turn], "max_tokens": 2,
                    "temperature": 0}
            status, _, raw = server.post("/v1/completions", json.dumps(body).encode(), headers, timeout_s=300)
            assert status == 200, raw
    logs = replica_logs(Path(server.state["run_dir"], "ray", "tmp"))
    return {str(key): {name for name, lines in logs.items() for line in lines
                       if (found := ENDED.search(line)) and found["prefix"] == key} for key in keys}
