"""The ``trtllm-kit`` command line: parse flags → spec → one library call → print."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from trtllm_kit import __version__
from trtllm_kit.errors import KitError
from trtllm_kit.interrupts import INTERRUPTS
from trtllm_kit.progress import Reporter, RichReporter


class KitClickError(click.ClickException):
    """A ``KitError`` shown as ``Error: <sentence>`` with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class KitGroup(click.Group):
    """Turns library exceptions into one line and an exit code; tracebacks only with ``--debug``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KitError as exc:
            if _debug(ctx):
                traceback.print_exc()
            raise KitClickError(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise KitClickError("interrupted; nothing was written.", 130) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if _debug(ctx):
                raise
            raise KitClickError(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback).",
                                1) from None


def _debug(ctx: click.Context) -> bool:
    return bool((ctx.obj or {}).get("debug"))


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def reporter_for(as_json: bool) -> Reporter:
    return Reporter() if as_json else RichReporter()


def given(ctx: click.Context, **values: Any) -> dict[str, Any]:
    """Only the options the user actually typed, so a config file's values are not overridden by defaults."""
    return {k: v for k, v in values.items() if ctx.get_parameter_source(k) is not ParameterSource.DEFAULT}


@click.group(cls=KitGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--debug", is_flag=True, envvar="TRTLLM_KIT_DEBUG", help="Show tracebacks on errors.")
@click.version_option(__version__, prog_name="trtllm-kit")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Hugging Face checkpoint → TensorRT-LLM checkpoint and engines → Triton model repository.

    \b
    Start with a built-in tiny model (no download, no GPU):
      trtllm-kit models
      trtllm-kit inspect builtin:tiny-llama --tp 2
      trtllm-kit build builtin:tiny-llama --tp 2 --pp 2 --out out/
      trtllm-kit verify out/checkpoint --against builtin:tiny-llama

    Errors exit with 2 for usage problems and 1 for failures.
    """
    ctx.ensure_object(dict)["debug"] = debug


def repo_flags(command: Any) -> Any:
    """The common options of the [repo] table (the Triton model repository) as ``build`` flags."""
    for option in reversed((
        click.option("--streaming/--no-streaming", "decoupled", default=True, show_default=True,
                     help="Decoupled tensorrt_llm and BLS models, as stream=true needs."),
        click.option("--kv-cache-reuse/--no-kv-cache-reuse", "enable_kv_cache_reuse", default=None,
                     help="Reuse KV blocks of shared prefixes (default: when the engine has paged context FMHA)."),
        click.option("--chunked-context/--no-chunked-context", "enable_chunked_context", default=None,
                     help="Split long prompts into chunks (default: when the engine has paged context FMHA)."),
        click.option("--batch-scheduler-policy", type=click.Choice(["guaranteed_no_evict", "max_utilization"]),
                     default="guaranteed_no_evict", show_default=True),
        click.option("--max-tokens-in-paged-kv-cache", type=int,
                     help="KV pool cap in tokens (default: max_batch_size x max_seq_len)."),
        click.option("--max-queue-size", type=int, default=0, show_default=True, help="0 = unbounded."),
        click.option("--max-queue-delay-us", "max_queue_delay_microseconds", type=int, default=0, show_default=True),
        click.option("--instances", type=int, help="Instances of preprocessing, postprocessing and BLS "
                     "(default: max_batch_size clipped to 5..16)."),
    )):
        command = option(command)
    return command


def quant_flags(command: Any) -> Any:
    """The options of the [quant] table (quantization and calibration), for ``build`` and ``inspect``."""
    for option in reversed((
        click.option("--quant", type=click.Choice(["none", "int8-wo", "int8-sq", "fp8"]), default="none",
                     show_default=True, help="Weights/activations: INT8 weight-only (W8A16), INT8 SmoothQuant, FP8."),
        click.option("--kv-cache", type=click.Choice(["auto", "int8", "fp8"]), default="auto", show_default=True,
                     help="KV-cache precision (auto: the model dtype)."),
        click.option("--smoothquant-alpha", type=float, default=0.5, show_default=True,
                     help="SmoothQuant migration strength α in [0, 1]."),
        click.option("--per-channel", is_flag=True, help="SmoothQuant: per-channel weight scales."),
        click.option("--per-token", is_flag=True, help="SmoothQuant: dynamic per-token activation scales."),
        click.option("--calib-data", help="Calibration text: .txt (one text per line) or .jsonl with a \"text\" "
                     "field (default: the corpus shipped with trtllm-kit)."),
        click.option("--calib-samples", type=int, default=512, show_default=True, help="Calibration windows."),
        click.option("--calib-seq-len", type=int, default=512, show_default=True, help="Tokens per window."),
        click.option("--calib-seed", type=int, default=1234, show_default=True, help="Seed of the window offsets."),
    )):
        command = option(command)
    return command


def engine_flags(command: Any) -> Any:
    """The options of the [engine] table (target, GPU, memory plan limits, trtllm-build overrides)."""
    for option in reversed((
        click.option("--target", type=click.Choice(["auto", "cpu", "engine"]), default="auto", show_default=True,
                     help="engine: compile with trtllm-build; cpu: no compile; auto: engine when a GPU and "
                     "tensorrt_llm are present."),
        click.option("--gpu", help="Plan for this GPU: H100-80GB, H200, A100-80GB, A100-40GB, L40S, L4, A10G, ... "
                     "(default: the visible GPU)."),
        click.option("--gpu-memory", type=float, help="Plan for this much GPU memory in GiB."),
        click.option("--kv-cache-fraction", type=float, default=0.9, show_default=True,
                     help="Share of the memory left after weights and activations given to the KV cache."),
        click.option("--max-batch-size", type=int, help="Default: the sequences of max_seq_len that fit (<= 256)."),
        click.option("--max-input-len", type=int, help="Default: max_seq_len / 2, at most max_num_tokens."),
        click.option("--max-seq-len", type=int, help="Default: the model's max_position_embeddings."),
        click.option("--max-num-tokens", type=int, help="Default: min(8192, max_batch_size x max_seq_len)."),
        click.option("--tokens-per-block", type=int, default=32, show_default=True, help="Paged KV block size."),
        click.option("--build-flag", "build_flags", multiple=True, metavar="NAME=VALUE",
                     help="Override a trtllm-build recipe flag (repeatable), e.g. gemm_plugin=disable."),
    )):
        command = option(command)
    return command


def engine_values(flags: dict[str, Any]) -> dict[str, Any]:
    """Spec fields from the [engine] flags the user typed (``--build-flag`` pairs become a table)."""
    if "build_flags" in flags:
        from trtllm_kit.build.recipe import parse_overrides

        flags["build_flags"] = parse_overrides(flags["build_flags"])
    return flags


def repo_values(flags: dict[str, Any]) -> dict[str, Any]:
    """Spec fields from the [repo] flags the user typed (``--instances`` sets all three counts)."""
    count = flags.pop("instances", None)
    if count is not None:
        flags.update(preprocessing_instances=count, postprocessing_instances=count, bls_instances=count)
    return flags


@cli.command()
@click.argument("model", required=False)
@click.option("--out", type=click.Path(path_type=Path), help="Output directory (created atomically).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="trtllm-kit.toml; flags override it.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size.")
@click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]), default="auto",
              show_default=True, help="Checkpoint dtype; auto takes the model's (float32 → float16).")
@click.option("--until", type=click.Choice(["checkpoint", "engine", "repo"]), default="repo", show_default=True,
              help="Last stage to run.")
@click.option("--verify/--no-verify", default=None, help="Check the checkpoint against transformers on the CPU "
              "(default: on for models up to 500M parameters).")
@click.option("--allow-pickle", is_flag=True, help="Accept .bin/.pt weights (loaded with weights_only=True).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest path and a summary as JSON.")
@click.option("--dry-run", is_flag=True, help="Print the plan (trtllm-kit plan) and build nothing.")
@click.option("--archive", type=click.Path(path_type=Path), help="Also pack the artifact into FILE (.tar, .tar.gz).")
@repo_flags
@quant_flags
@engine_flags
@click.pass_context
def build(ctx: click.Context, model: str | None, out: Path | None, config_file: Path | None, tp: int, pp: int,
          dtype: str, until: str, verify: bool | None, allow_pickle: bool, force: bool, as_json: bool,
          dry_run: bool, archive: Path | None, **repo: Any) -> None:
    """Convert MODEL (a directory, builtin:NAME or a repo id in the local HF cache).

    \b
    Example:
      trtllm-kit build builtin:tiny-llama --tp 2 --pp 2 --until checkpoint --out out/
      trtllm-kit build builtin:tiny-llama --quant fp8 --kv-cache fp8 --tp 2 --until checkpoint --out out-fp8/
    """
    from trtllm_kit.build.pipeline import run_build
    from trtllm_kit.spec import build_spec, load_toml

    file_values = load_toml(config_file) if config_file else {}
    flags = given(ctx, tp=tp, pp=pp, dtype=dtype, until=until, allow_pickle=allow_pickle, force=force)
    flags.update({k: v for k, v in {"model": model, "out": out, "verify": verify}.items() if v is not None})
    flags.update(engine_values(repo_values(given(ctx, **repo))))
    if archive is not None:
        flags["archive"] = archive
    spec = build_spec(file_values, flags)
    if dry_run:
        _print_plan(spec, None, as_json)
        return
    result = run_build(spec, reporter_for(as_json))
    if as_json:
        emit_json(result.summary)
    else:
        click.echo(f"wrote {result.out_dir} (manifest: {result.manifest_path})")


@cli.command()
@click.argument("model", required=False)
@click.option("--out", type=click.Path(path_type=Path), help="The artifact directory whose stage cache is checked "
              "(default: the config file's, else out/).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="trtllm-kit.toml; flags override it.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size.")
@click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]), default="auto",
              show_default=True, help="Checkpoint dtype.")
@click.option("--until", type=click.Choice(["checkpoint", "engine", "repo"]), default="repo", show_default=True,
              help="Last stage to plan.")
@click.option("--verify/--no-verify", default=None, help="As for build (part of the checkpoint's cache key).")
@click.option("--allow-pickle", is_flag=True, help="Accept .bin/.pt weights.")
@click.option("--graph", type=click.Path(path_type=Path), help="Write one decoder layer as the engine will run it "
              "(ONNX; opens in Netron).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@repo_flags
@quant_flags
@engine_flags
@click.pass_context
def plan(ctx: click.Context, model: str | None, out: Path | None, config_file: Path | None, tp: int, pp: int,
         dtype: str, until: str, verify: bool | None, allow_pickle: bool, graph: Path | None, as_json: bool,
         **options: Any) -> None:
    """Plan a build of MODEL without doing it: per-rank memory, KV capacity, stages with their cache status,
    the exact trtllm-build command and the fused decoder layer. Only the model's config.json is needed.

    \b
    Example:
      trtllm-kit plan builtin:tiny-llama --gpu L4 --graph layer.onnx
      trtllm-kit plan ./Meta-Llama-3-70B --gpu H100-80GB --tp 4 --kv-cache fp8 --json
    """
    from trtllm_kit.spec import build_spec, load_toml

    file_values = load_toml(config_file) if config_file else {}
    flags = given(ctx, tp=tp, pp=pp, dtype=dtype, until=until, allow_pickle=allow_pickle)
    flags.update({k: v for k, v in {"model": model, "out": out, "verify": verify}.items() if v is not None})
    flags.update(engine_values(repo_values(given(ctx, **options))))
    file_values.setdefault("out", Path("out"))
    _print_plan(build_spec(file_values, flags), graph, as_json)


def _print_plan(spec: Any, graph: Path | None, as_json: bool) -> None:
    from trtllm_kit.build.dry_run import dry_run, print_dry_run

    report = dry_run(spec, graph)
    if as_json:
        emit_json(report)
    else:
        print_dry_run(report)


@cli.group()
def artifact() -> None:
    """Check build artifacts (directories or archives made with --archive).

    \b
    Example:
      trtllm-kit artifact verify out.tar --hashes-only
    """


@artifact.command(name="verify")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--hashes-only", is_flag=True, help="Check the files only, not whether the engines run here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def artifact_verify(path: Path, hashes_only: bool, as_json: bool) -> None:
    """Check every file of PATH (an artifact directory or archive) against its manifest's sha256, and whether its
    engines can run on this machine (TensorRT-LLM/TensorRT versions, GPU compute capability).

    \b
    Example:
      trtllm-kit build builtin:tiny-llama --until checkpoint --out out/ --archive out.tar.gz
      trtllm-kit artifact verify out.tar.gz
    """
    from trtllm_kit.build.archive import verdict, verify_artifact
    from trtllm_kit.build.compat import detect_machine
    from trtllm_kit.errors import KitError

    report = verify_artifact(path, detect_machine())
    if as_json:
        emit_json(report.to_dict())
    else:
        engines = ("engines compatible with this machine" if not report.problems else
                   f"engines not runnable here: {'; '.join(report.problems)}") if report.has_engines else "no engines"
        click.echo(f"{report.num_files} files checked, hashes {'ok' if report.hashes_ok else 'DIFFER'}; {engines}")
    failure = verdict(report, hashes_only=hashes_only)
    if failure:
        raise KitError(failure)


@cli.command()
@click.argument("repo", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def validate(repo: Path, as_json: bool) -> None:
    """Check a Triton model REPO (a build's OUT/repo, or OUT) as the server would, and more: config syntax,
    leftover ${...}, batch size, world size and paged-context features against the engine, decoupled mode,
    ensemble wiring, tokenizer files and the KV-cache plan. Exits 1 on any error.

    \b
    Example:
      trtllm-kit validate out/repo
    """
    from trtllm_kit.model_repo.validate import print_report, validate_repository

    if (repo / "repo").is_dir() and not (repo / "config.pbtxt").exists():
        repo = repo / "repo"
    report = validate_repository(repo)
    if as_json:
        emit_json(report.to_dict())
    else:
        print_report(report)
    if report.errors:
        raise KitError(f"{len(report.errors)} error(s) in {repo}; Triton would refuse or misserve it: fix them "
                       "(or rebuild) and validate again.")


@cli.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--against", "hf_source", required=True, help="The HF model: a directory, builtin:NAME or repo id.")
@click.option("--compute-dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Precision of both forward passes.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(checkpoint: Path, hf_source: str, compute_dtype: str, as_json: bool) -> None:
    """Run a TensorRT-LLM CHECKPOINT (or a build's output directory) on the CPU, rank by rank, and compare
    its logits with transformers.

    \b
    Example:
      trtllm-kit verify out/checkpoint --against builtin:tiny-llama
    """
    from trtllm_kit.build.artifact import checkpoint_dir
    from trtllm_kit.build.inspect import resolve_model_path
    from trtllm_kit.build.verify import verify_checkpoint
    from trtllm_kit.errors import VerifyError

    report = verify_checkpoint(checkpoint_dir(checkpoint), resolve_model_path(hf_source), compute_dtype=compute_dtype)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(f"max abs error {report.max_abs_err:.3e}, max rel error {report.max_rel_err:.3e}, "
                   f"top-1 agreement {report.top1_agreement:.2%} over {report.num_tokens} tokens "
                   + (f"(quantized, {report.compute_dtype})" if report.quantization else
                      f"(tolerance {report.tolerance:.1e}, {report.compute_dtype})"))
        if report.quantization:
            click.echo(report.quality_summary())
    if not report.passed and report.quantization:
        raise VerifyError(report.quality_failure())
    if not report.passed:
        raise VerifyError(f"logits differ by {report.max_abs_err:.3e}, more than the tolerance "
                          f"{report.tolerance:.1e}; the checkpoint does not match {hf_source}.")


@cli.command(name="inspect")
@click.argument("model")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size to plan for.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size to plan for.")
@click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]), default="auto",
              show_default=True)
@click.option("--allow-pickle", is_flag=True, help="Accept .bin/.pt weights.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@quant_flags
def inspect_command(model: str, tp: int, pp: int, dtype: str, allow_pickle: bool, as_json: bool,
                    **quant: Any) -> None:
    """Show what MODEL is and what a build at --tp/--pp would write, without converting.

    \b
    Example:
      trtllm-kit inspect builtin:tiny-qwen2 --tp 4 --pp 2
    """
    from trtllm_kit.build.describe import describe_build, print_description
    from trtllm_kit.quant.algos import QuantConfig

    quant["calib_data"] = Path(quant["calib_data"]) if quant["calib_data"] else None
    description = describe_build(model, tp, pp, dtype, allow_pickle=allow_pickle, quant=QuantConfig(**quant))
    if as_json:
        emit_json(description)
    else:
        print_description(description)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def models(as_json: bool) -> None:
    """List the built-in tiny models and the supported families.

    \b
    Example:
      trtllm-kit models --json
    """
    from trtllm_kit.models.builtin import BUILTIN_MODELS
    from trtllm_kit.models.registry import FAMILIES

    listing = {
        "builtin": {f"builtin:{name}": m.description for name, m in BUILTIN_MODELS.items()},
        "families": {f.name: list(f.architectures) for f in FAMILIES},
    }
    if as_json:
        emit_json(listing)
        return
    click.echo("Built-in models (generated locally on first use):")
    for name, description in listing["builtin"].items():
        click.echo(f"  {name:<22} {description}")
    click.echo("Families:")
    for name, architectures in listing["families"].items():
        click.echo(f"  {name:<22} {', '.join(architectures)}")


@cli.command()
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
@click.option("--json", "as_json", is_flag=True, help="Print the server's state as JSON when ready.")
def serve(out: Path, host: str, http_port: int, grpc_port: int, metrics_port: int, openai_port: int | None,
          api_key: str | None, model: str | None, detach: bool, tritonserver: Path | None, ready_timeout: float,
          log_verbose: int, as_json: bool) -> None:
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
                           ready_timeout_s=ready_timeout, log_verbose=log_verbose)

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


@cli.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds before everything is killed.")
def stop(out: Path, timeout: float) -> None:
    """Stop the server of OUT started by trtllm-kit serve (--detach or not).

    \b
    Example:
      trtllm-kit stop out/
    """
    from trtllm_kit.serve.service import stop_serving

    result = stop_serving(out, timeout)
    click.echo(f"stopped pid {result['pid']}" + (" (killed after the timeout)" if result["forced"] else ""))


@cli.command()
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


def _register_profile_commands() -> None:
    from trtllm_kit.profile.commands import bench, profile

    cli.add_command(bench)
    cli.add_command(profile)


_register_profile_commands()


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` and return the exit code (testable apart from ``main``)."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="trtllm-kit", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted.", err=True)
        return 130
    return 0


def main() -> None:
    INTERRUPTS.install()
    sys.exit(run())
