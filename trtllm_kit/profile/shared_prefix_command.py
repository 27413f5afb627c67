"""``bench --workload shared-prefix``: its flags and the call that runs it (``profile/shared_prefix_run.py``)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from trtllm_kit.errors import KitUsageError

WORKLOADS = ("synthetic", "shared-prefix")
FLAGS = ("workload", "num_prefixes", "num_users", "num_turns", "prefix_tokens", "dynamo_logs", "block_size")


def shared_prefix_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The workload flags ``bench`` gains for the shared-prefix workload."""
    options = [
        click.option("--workload", type=click.Choice(WORKLOADS), default="synthetic", show_default=True,
                     help="shared-prefix: --prefixes system prompts x --users users over --turns turns, each turn "
                     "repeating the conversation so far (--isl tokens per user message, --osl per reply)."),
        click.option("--prefixes", "num_prefixes", type=int, default=4, show_default=True,
                     help="Shared-prefix: system prompts."),
        click.option("--users", "num_users", type=int, default=16, show_default=True, help="Shared-prefix: users."),
        click.option("--turns", "num_turns", type=int, default=3, show_default=True,
                     help="Shared-prefix: turns per user."),
        click.option("--prefix-tokens", type=int, default=512, show_default=True,
                     help="Shared-prefix: tokens per system prompt."),
        click.option("--dynamo-logs", type=click.Path(path_type=Path),
                     help="Shared-prefix on serve --dynamo: its RUN_DIR/dynamo, for requests per worker, the "
                     "prefix hit rate the routing allows and the one the workers counted (--openai-url: Dynamo's "
                     "own frontend, the serve state's dynamo_frontend; the bench runs in the serve's private "
                     "network namespace, as the serve's user)."),
        click.option("--block-size", type=int, help="Shared-prefix: the workers' tokens per KV block (default: "
                     "the Dynamo frontend's /metrics)."),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), fn)


def bench_shared_prefix(values: dict[str, Any], as_json: bool) -> None:
    """Run the shared-prefix workload from ``bench``'s flags and print its line (or JSON).

    Arguments:
        values: ``bench``'s parsed flags.
        as_json: print the result as JSON.
    """
    from trtllm_kit.profile.shared_prefix import SharedPrefixSpec
    from trtllm_kit.profile.shared_prefix_run import RESULT_FILE, run_shared_prefix
    from trtllm_kit.serve.dynamo.launch import serve_net

    if values["out"] is None:
        raise KitUsageError("no result directory given; pass --out DIR.")
    if not values["openai_url"]:
        raise KitUsageError("--workload shared-prefix sends token-id prompts to an OpenAI endpoint; pass "
                            "--openai-url http://HOST:PORT/v1.")
    concurrency = values["concurrency"] or "1"
    if not concurrency.isdigit() or int(concurrency) < 1:
        raise KitUsageError(f"--workload shared-prefix takes one whole --concurrency, got {concurrency!r}; "
                            "example: --concurrency 4.")
    spec = SharedPrefixSpec(num_prefixes=values["num_prefixes"], num_users=values["num_users"],
                            num_turns=values["num_turns"], prefix_tokens=values["prefix_tokens"],
                            turn_tokens=values["isl"], osl=values["osl"], vocab_size=values["vocab_size"],
                            seed=values["seed"])
    run = functools.partial(run_shared_prefix, spec, values["openai_url"], values["out"], int(concurrency),
                            values["dynamo_logs"], values["block_size"], values["model"], values["api_key"],
                            values["timeout_s"])
    if values["dynamo_logs"] is None:
        result = asyncio.run(run())
    else:  # Dynamo's frontend and the workers' /metrics answer inside the serve's network namespace alone
        net = serve_net(values["dynamo_logs"])
        try:
            result = net.call(lambda: asyncio.run(run()))
        finally:
            net.close()
    if as_json:
        click.echo(json.dumps(asdict(result), indent=2, default=str))
        return
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(result.line())
    click.echo(f"wrote {values['out'] / RESULT_FILE}")
