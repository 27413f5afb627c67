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


@cli.command()
@click.argument("model", required=False)
@click.option("--out", type=click.Path(path_type=Path), help="Output directory (created atomically).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="trtllm-kit.toml; flags override it.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size.")
@click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]), default="auto",
              show_default=True, help="Checkpoint dtype; auto takes the model's (float32 → float16).")
@click.option("--until", type=click.Choice(["checkpoint"]), default="checkpoint", show_default=True,
              help="Last stage to run.")
@click.option("--verify/--no-verify", default=None, help="Check the checkpoint against transformers on the CPU "
              "(default: on for models up to 500M parameters).")
@click.option("--allow-pickle", is_flag=True, help="Accept .bin/.pt weights (loaded with weights_only=True).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest path and a summary as JSON.")
@click.pass_context
def build(ctx: click.Context, model: str | None, out: Path | None, config_file: Path | None, tp: int, pp: int,
          dtype: str, until: str, verify: bool | None, allow_pickle: bool, force: bool, as_json: bool) -> None:
    """Convert MODEL (a directory, builtin:NAME or a repo id in the local HF cache).

    \b
    Example:
      trtllm-kit build builtin:tiny-llama --tp 2 --pp 2 --until checkpoint --out out/
    """
    from trtllm_kit.build.pipeline import run_build
    from trtllm_kit.spec import build_spec, load_toml

    file_values = load_toml(config_file) if config_file else {}
    flags = given(ctx, tp=tp, pp=pp, dtype=dtype, until=until, allow_pickle=allow_pickle, force=force)
    flags.update({k: v for k, v in {"model": model, "out": out, "verify": verify}.items() if v is not None})
    spec = build_spec(file_values, flags)
    result = run_build(spec, reporter_for(as_json))
    if as_json:
        emit_json(result.summary)
    else:
        click.echo(f"wrote {result.out_dir} (manifest: {result.manifest_path})")


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
                   f"(tolerance {report.tolerance:.1e}, {report.compute_dtype})")
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
def inspect_command(model: str, tp: int, pp: int, dtype: str, allow_pickle: bool, as_json: bool) -> None:
    """Show what MODEL is and what a build at --tp/--pp would write, without converting.

    \b
    Example:
      trtllm-kit inspect builtin:tiny-qwen2 --tp 4 --pp 2
    """
    from trtllm_kit.build.describe import describe_build, print_description

    description = describe_build(model, tp, pp, dtype, allow_pickle=allow_pickle)
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
