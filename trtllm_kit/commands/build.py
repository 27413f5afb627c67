"""``build`` and ``plan``: flags and ``trtllm-kit.toml`` → BuildSpec → the pipeline (or its dry run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtllm_kit.commands.build_flags import engine_flags, engine_values, quant_flags, repo_flags, repo_values
from trtllm_kit.commands.common import emit_json, given, reporter_for


def layout_options(command: Any) -> Any:
    """The config file, parallel layout and dtype, shared by ``build`` and ``plan``."""
    for option in reversed((
        click.option("--config", "config_file", type=click.Path(path_type=Path),
                     help="trtllm-kit.toml; flags override it."),
        click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size."),
        click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size."),
        click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]), default="auto",
                     show_default=True, help="Checkpoint dtype; auto takes the model's (float32 → float16)."),
    )):
        command = option(command)
    return command


def spec_sources(ctx: click.Context, config_file: Path | None, named: dict[str, Any], typed: dict[str, Any],
                 stage_flags: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config file's values and the flags the user gave, as ``build_spec`` takes them.

    Arguments:
        ctx: the command's context; config_file: ``--config`` or None; named: model/out/verify (None: not given);
        typed: flags that count only when typed; stage_flags: the [engine]/[repo]/[quant] flags.
    """
    from trtllm_kit.spec import load_toml

    file_values = load_toml(config_file) if config_file else {}
    flags = given(ctx, **typed)
    flags.update({k: v for k, v in named.items() if v is not None})
    flags.update(engine_values(repo_values(given(ctx, **stage_flags))))
    return file_values, flags


@click.command()
@click.argument("model", required=False)
@click.option("--out", type=click.Path(path_type=Path), help="Output directory (created atomically).")
@layout_options
@click.option("--until", type=click.Choice(["checkpoint", "engine", "repo"]), default="repo", show_default=True,
              help="Last stage to run.")
@click.option("--verify/--no-verify", default=None, help="Check the checkpoint against transformers on the CPU "
              "(default: on for models up to 500M parameters).")
@click.option("--allow-pickle", is_flag=True, help="Accept .bin/.pt weights (loaded with weights_only=True).")
@click.option("--force", is_flag=True, help="Rebuild every stage, ignoring the stage cache, and replace --out even "
              "when it holds files that are not a trtllm-kit artifact. Without it, a build into an existing "
              "artifact already replaces it (atomically), reusing the stages whose inputs did not change.")
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
    from trtllm_kit.spec import build_spec

    file_values, flags = spec_sources(ctx, config_file, {"model": model, "out": out, "verify": verify},
                                      {"tp": tp, "pp": pp, "dtype": dtype, "until": until,
                                       "allow_pickle": allow_pickle, "force": force}, repo)
    if archive is not None:
        flags["archive"] = archive
    if dry_run:  # as plan: --out only names the artifact whose stage cache is checked
        file_values.setdefault("out", Path("out"))
        _print_plan(build_spec(file_values, flags), None, as_json)
        return
    spec = build_spec(file_values, flags)
    result = run_build(spec, reporter_for(as_json))
    if as_json:
        emit_json(result.summary)
    else:
        click.echo(f"wrote {result.out_dir} (manifest: {result.manifest_path})")


@click.command()
@click.argument("model", required=False)
@click.option("--out", type=click.Path(path_type=Path), help="The artifact directory whose stage cache is checked "
              "(default: the config file's, else out/).")
@layout_options
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
    from trtllm_kit.spec import build_spec

    file_values, flags = spec_sources(ctx, config_file, {"model": model, "out": out, "verify": verify},
                                      {"tp": tp, "pp": pp, "dtype": dtype, "until": until,
                                       "allow_pickle": allow_pickle}, options)
    file_values.setdefault("out", Path("out"))
    _print_plan(build_spec(file_values, flags), graph, as_json)


def _print_plan(spec: Any, graph: Path | None, as_json: bool) -> None:
    from trtllm_kit.build.dry_run import dry_run, print_dry_run

    report = dry_run(spec, graph)
    if as_json:
        emit_json(report)
    else:
        print_dry_run(report)
