"""The ``trtllm-kit`` command line: parse flags → spec → one library call → print."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from trtllm_kit import __version__
from trtllm_kit.errors import KitError
from trtllm_kit.interrupts import INTERRUPTED, INTERRUPTS

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).


class KitClickError(click.ClickException):
    """A ``KitError`` shown as ``Error: <sentence>`` with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares a class default; each error sets its own


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
            raise KitClickError(INTERRUPTED, 130) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if _debug(ctx):
                raise
            raise KitClickError(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback).",
                                1) from None


def _debug(ctx: click.Context) -> bool:
    return bool((ctx.obj or {}).get("debug"))


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


def _register_commands() -> None:
    from trtllm_kit.commands.build import build, plan
    from trtllm_kit.commands.checks import artifact, inspect_command, models, validate, verify
    from trtllm_kit.commands.deploy import deploy
    from trtllm_kit.commands.keys import keys
    from trtllm_kit.commands.lora import lora
    from trtllm_kit.commands.serve import generate, reload, serve, stop
    from trtllm_kit.profile.commands import bench, profile

    for command in (build, plan, inspect_command, verify, validate, artifact, models, serve, stop, reload, generate,
                    bench, profile, deploy, keys, lora):
        cli.add_command(command)


_register_commands()


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` and return the exit code (testable apart from ``main``)."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="trtllm-kit", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort as exc:  # click's own name for a Ctrl-C while it parses the arguments
        interrupted = isinstance(exc.__context__, KeyboardInterrupt)
        click.echo(f"Error: {INTERRUPTED}" if interrupted else "Aborted.", err=True)
        return 130
    return 0


def main() -> None:
    INTERRUPTS.install()
    sys.exit(run())
