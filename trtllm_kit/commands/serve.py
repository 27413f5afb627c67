"""``serve``, ``stop`` and ``generate``: bring up tritonserver for a build, end it, talk to it."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from trtllm_kit.commands.build_flags import config_option, declared_fields, spec_options, typed_values
from trtllm_kit.commands.output import emit_json
from trtllm_kit.commands.sampling_flags import SamplingCommand
from trtllm_kit.errors import KitUsageError
from trtllm_kit.names import API_KEY_ENV
from trtllm_kit.safe_files import UnsafeFileError, read_bounded

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).

if TYPE_CHECKING:
    from trtllm_kit.serve.options import ServeOptions


@click.command()
@click.argument("outs", metavar="[OUT]...", nargs=-1, type=click.Path(path_type=Path))
@config_option("trtllm-kit.toml: its [serve] table, and its out when OUT is not given; flags override it.")
@spec_options(declared_fields("serve", top_level=False), config=False)
@click.option("--api-key", envvar=API_KEY_ENV, help="Require 'Authorization: Bearer KEY' on the OpenAI "
              f"API. Prefer env {API_KEY_ENV} or --api-key-file: a value given here is hidden from the process's "
              "command line once the command starts, but other users can read it until then (and in your shell "
              "history). Never read from a config file.")
@click.option("--api-key-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Read the --api-key KEY from the first line of FILE (keep it mode 0600).")
@click.option("--name", "names", multiple=True, metavar="NAME=OUT", help="Serve OUT under the model name NAME "
              "(default: its model source, made unique); repeatable.")
@click.option("--alias", "aliases", multiple=True, metavar="NAME=A:W,B:W", help="An A/B alias: requests for NAME "
              "go to the served models A, B, ... by the weights W (sticky per OpenAI 'user'); repeatable.")
@click.option("--detach", is_flag=True, help="Return once ready; end it with trtllm-kit stop OUT.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's state as JSON when ready.")
@click.pass_context
def serve(ctx: click.Context, outs: tuple[Path, ...], config_file: Path | None, api_key: str | None,
          api_key_file: Path | None, names: tuple[str, ...], aliases: tuple[str, ...], detach: bool, as_json: bool,
          **_flags: Any) -> None:
    """Serve a build's OUT/repo with tritonserver (under mpirun when tp x pp > 1); return only when ready.
    Several OUTs share one server, each under its own model name; the OpenAI frontend routes by 'model'.

    \b
    Example:
      trtllm-kit serve out/ --openai-port 9000
      trtllm-kit serve out-a/ out-b/ --name a=out-a/ --name b=out-b/ --alias chat=a:90,b:10 --openai-port 9000
      trtllm-kit serve --config trtllm-kit.toml --detach
      trtllm-kit generate "Hello" --max-tokens 16
    """
    from trtllm_kit.serve.service import serve as serve_out
    from trtllm_kit.serve.service import serve_detached

    if api_key_file is not None:
        if api_key:
            raise KitUsageError(f"--api-key-file and --api-key (or {API_KEY_ENV}) both give the key; pass one.")
        api_key = read_key_file(api_key_file)
    options = serve_options(ctx, outs[0] if outs else None, config_file, api_key, more=outs[1:], names=names,
                            aliases=aliases)

    def ready(state: dict[str, Any]) -> None:
        if as_json:
            emit_json(state)
            return
        openai = f", OpenAI http://{state['openai']}/v1" if state.get("openai") else ""
        roles = " disaggregated," if state.get("disagg") else ""
        if state.get("server") == "dynamo":
            click.echo(f"ready in {state['ready_s']:.1f} s: {state['model']} on Dynamo, OpenAI http://{state['openai']}"
                       f"/v1, {len(state['workers'])} workers, --router {state['router']} (pid {state['pid']}, logs "
                       f"{state['run_dir']}/dynamo)" + ("" if detach else "; Ctrl-C to stop"), err=not as_json)
            return
        if state.get("server") == "ray":
            click.echo(f"ready in {state['ready_s']:.1f} s: {state['model']} on Ray Serve, OpenAI http://"
                       f"{state['openai']}/v1, replicas {state['replicas']['min']}:{state['replicas']['max']} "
                       f"(pid {state['pid']}, log {state['log']})" + ("" if detach else "; Ctrl-C to stop"),
                       err=not as_json)
            return
        if state.get("server") == "trtllm-serve":
            click.echo(f"ready in {state['ready_s']:.1f} s: trtllm-serve,{roles} OpenAI http://{state['openai']}/v1 "
                       f"(pid {state['server_pid']}, log {state['log']})", err=not as_json)
            return
        if state.get("disagg"):
            roles = f" (context server gRPC {state['context']['grpc']}, metrics {state['context']['metrics']})"
        click.echo(f"ready in {state['ready_s']:.1f} s: {state['model']} on HTTP http://{state['http']}, gRPC "
                   f"{state['grpc']}, metrics http://{state['metrics']}/metrics{openai}{roles} (pid {state['pid']}, "
                   f"log {state['log']})" + ("" if detach else "; Ctrl-C to stop"), err=not as_json)

    if detach:
        ready(serve_detached(options))
        return
    try:
        serve_out(options, ready)
    finally:  # everything is stopped: spare the exit a full collection of every module's objects (seconds)
        gc.freeze()


MAX_KEY_FILE_BYTES = 4096


def read_key_file(path: Path) -> str:
    """The API key on the first line of ``path``: a regular file of at most 4 KiB, read as ``safe_files`` reads
    (a FIFO or a device is refused, not read). The operator names it, so its links may lead anywhere.

    Arguments:
        path: the key file.
    """
    try:
        data = read_bounded(path, root=Path("/"), max_bytes=MAX_KEY_FILE_BYTES, bounded_as="an API key file")
    except UnsafeFileError as exc:
        raise UnsafeFileError(f"--api-key-file {exc}") from None
    lines = data.decode(errors="replace").splitlines()
    key = lines[0].strip() if lines else ""
    if not key:
        raise KitUsageError(f"--api-key-file {path} has no key on its first line; write the key there.")
    return key


def serve_options(ctx: click.Context, out: Path | None, config_file: Path | None, api_key: str | None, *,
                  more: tuple[Path, ...] = (), names: tuple[str, ...] = (),
                  aliases: tuple[str, ...] = ()) -> ServeOptions:
    """The ``ServeOptions`` of a ``serve`` command line: the flags typed, over the config file's ``[serve]`` table
    and its ``out`` (when OUT is not given), over the declared defaults.

    Arguments:
        ctx: the command's context; out: OUT or None; config_file: ``--config`` or None; api_key: ``--api-key``;
        more: further OUTs; names: ``--name NAME=OUT``; aliases: ``--alias NAME=A:W,B:W``.
    """
    from trtllm_kit.serve.options import ServeOptions, parse_names
    from trtllm_kit.spec import ServeSettings, load_toml, merge

    values = merge(load_toml(config_file) if config_file else {}, typed_values(ctx))
    out = out if out is not None else (Path(values["out"]) if values.get("out") else None)
    if out is None and names:
        out = next(iter(parse_names(names).values()))
    if out is None:
        raise KitUsageError("no build to serve; pass OUT or set out = \"...\" in the --config file.")
    settings = ServeSettings(**values.get("serve", {}))
    return ServeOptions(out=out, settings=settings, api_key=api_key, more=more, names=names, aliases=aliases)


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
    from trtllm_kit.serve.server.detach import last_detached, stop_serving  # not service: a quarter second of imports

    out = out if out is not None else last_detached()
    result = stop_serving(out, timeout)
    if result["pid"] is None:
        click.echo(f"nothing to stop: no trtllm-kit serve of {out} is running")
        return
    click.echo(f"stopped pid {result['pid']}" + (" (killed after the timeout)" if result["forced"] else ""))


@click.command(cls=SamplingCommand)
@click.argument("prompt")
@click.option("--url", default="127.0.0.1:8001", show_default=True, help="The server's gRPC endpoint.")
@click.option("--model", help="tensorrt_llm_bls or ensemble (default: the first of them the server has ready).")
@click.option("--max-tokens", type=int, default=64, show_default=True)
def generate(prompt: str, url: str, model: str | None, max_tokens: int, **sampling: Any) -> None:
    """Stream a completion of PROMPT from a running server to the terminal (with the serve's Triton token when
    this user started it with trtllm-kit serve). Without sampling flags the answer is greedy; a temperature of 0
    is greedy too.

    \b
    Example:
      trtllm-kit generate "The capital of France is" --max-tokens 16
    """
    import asyncio

    from trtllm_kit.serve.client import generate_to
    from trtllm_kit.serve.server.launcher import grpc_headers
    from trtllm_kit.serve.server.state import token_for
    from trtllm_kit.wire import GenerationRequest
    from trtllm_kit.wire.request import greedy_settings

    request = GenerationRequest(prompt, max_tokens, **greedy_settings(sampling))  # as every engine takes greedy
    headers = grpc_headers(token_for(url))  # the owner's own serve: its token, from the run directory
    asyncio.run(generate_to(url, model, request, lambda text: click.echo(text, nl=False), headers))
    click.echo()


@click.command()
@click.argument("name")
@click.argument("new_out", type=click.Path(path_type=Path))
@click.option("--out", "served_out", type=click.Path(path_type=Path), help="An OUT the running serve serves "
              "(default: the last one started with --detach).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the result.")
@click.option("--json", "as_json", is_flag=True, help="Print what happened as JSON.")
@click.option("--force", is_flag=True, help="Serve NEW_OUT even when its model family, tokenizer or target differs "
              "from the served version's.")
def reload(name: str, new_out: Path, served_out: Path | None, timeout: float, as_json: bool, force: bool) -> None:
    """Swap the served model NAME for the build NEW_OUT without dropping a request: the new version loads beside
    the old one, new requests go to it, the old one finishes its requests and is unloaded.

    \b
    Example:
      trtllm-kit reload builtin:tiny-llama out-v2/ --out out/
    """
    from trtllm_kit.serve.fleet.reload import request_reload
    from trtllm_kit.serve.service import last_detached

    result = request_reload(served_out if served_out is not None else last_detached(), name, new_out, timeout,
                            force=force)
    if as_json:
        emit_json(result)
        return
    click.echo(f"{name}: version {result['old_version']} -> {result['version']} ({new_out}); switched after "
               f"{result['switch_s']:.2f} s, {result['in_flight_at_switch']} request(s) in flight then "
               f"{'drained' if result['drained'] else 'NOT drained'}, done in {result['total_s']:.2f} s")
