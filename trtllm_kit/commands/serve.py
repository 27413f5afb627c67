"""``serve``, ``stop`` and ``generate``: bring up tritonserver for a build, end it, talk to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtllm_kit.commands.common import emit_json


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address of every endpoint.")
@click.option("--http-port", type=int, default=8000, show_default=True)
@click.option("--grpc-port", type=int, default=8001, show_default=True)
@click.option("--metrics-port", type=int, default=8002, show_default=True)
@click.option("--openai-port", type=int, help="Also serve the OpenAI API (/v1/...) on this port.")
@click.option("--api-key", envvar="TRTLLM_KIT_API_KEY", help="Require 'Authorization: Bearer KEY' on the OpenAI "
              "API (env TRTLLM_KIT_API_KEY).")
@click.option("--model", help="Public model: tensorrt_llm_bls or ensemble (default: BLS when the repo has it; "
              "it streams in order).")
@click.option("--detach", is_flag=True, help="Return once ready; end it with trtllm-kit stop OUT.")
@click.option("--tritonserver", type=click.Path(path_type=Path), help="The tritonserver binary or its install dir.")
@click.option("--ready-timeout", type=float, default=300.0, show_default=True, help="Seconds to wait for ready.")
@click.option("--log-verbose", type=int, default=0, show_default=True, help="tritonserver --log-verbose level.")
@click.option("--verify", is_flag=True, help="Check every file's sha256 against the manifest before starting "
              "(default: sizes and times, hashing only files whose time changed).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's state as JSON when ready.")
def serve(out: Path, host: str, http_port: int, grpc_port: int, metrics_port: int, openai_port: int | None,
          api_key: str | None, model: str | None, detach: bool, tritonserver: Path | None, ready_timeout: float,
          log_verbose: int, verify: bool, as_json: bool) -> None:
    """Serve a build's OUT/repo with tritonserver (under mpirun when tp x pp > 1); return only when ready.

    \b
    Example:
      trtllm-kit serve out/ --openai-port 9000
      trtllm-kit generate "Hello" --max-tokens 16
    """
    from trtllm_kit.serve.launcher import Endpoints
    from trtllm_kit.serve.service import ServeOptions, serve_detached
    from trtllm_kit.serve.service import serve as serve_out

    options = ServeOptions(out=out, endpoints=Endpoints(host, http_port, grpc_port, metrics_port),
                           openai_port=openai_port, api_key=api_key, tritonserver=tritonserver, model=model,
                           ready_timeout_s=ready_timeout, log_verbose=log_verbose, verify=verify)

    def ready(state: dict[str, Any]) -> None:
        if as_json:
            emit_json(state)
            return
        openai = f", OpenAI http://{state['openai']}/v1" if state.get("openai") else ""
        click.echo(f"ready in {state['ready_s']:.1f} s: {state['model']} on HTTP http://{state['http']}, gRPC "
                   f"{state['grpc']}, metrics http://{state['metrics']}/metrics{openai} (pid {state['pid']}, log "
                   f"{state['log']})" + ("" if detach else "; Ctrl-C to stop"), err=not as_json)

    if detach:
        ready(serve_detached(options))
    else:
        serve_out(options, ready)


@click.command()
@click.argument("out", type=click.Path(path_type=Path), required=False)
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds before everything is killed.")
def stop(out: Path | None, timeout: float) -> None:
    """Stop the server of OUT started by trtllm-kit serve (--detach or not); without OUT, the last one
    started with --detach.

    \b
    Example:
      trtllm-kit stop out/
    """
    from trtllm_kit.serve.service import last_detached, stop_serving

    out = out if out is not None else last_detached()
    result = stop_serving(out, timeout)
    click.echo(f"stopped pid {result['pid']}" + (" (killed after the timeout)" if result["forced"] else ""))


@click.command()
@click.argument("prompt")
@click.option("--url", default="127.0.0.1:8001", show_default=True, help="The server's gRPC endpoint.")
@click.option("--model", help="tensorrt_llm_bls or ensemble (default: the first of them the server has ready).")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, help="0 or omitted: greedy.")
@click.option("--top-p", type=float)
@click.option("--top-k", type=int)
@click.option("--seed", type=int)
def generate(prompt: str, url: str, model: str | None, max_tokens: int, temperature: float | None, top_p: float | None,
             top_k: int | None, seed: int | None) -> None:
    """Stream a completion of PROMPT from a running server to the terminal.

    \b
    Example:
      trtllm-kit generate "The capital of France is" --max-tokens 16
    """
    import asyncio

    from trtllm_kit.serve.client import GenerationRequest, generate_to

    request = GenerationRequest(prompt, max_tokens, temperature or None, top_p, top_k, seed)
    asyncio.run(generate_to(url, model, request, lambda text: click.echo(text, nl=False)))
    click.echo()
