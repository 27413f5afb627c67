"""Commands that look without building: ``verify``, ``inspect``, ``models``, ``validate``, ``artifact verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtllm_kit.commands.build_flags import declared_fields, spec_options
from trtllm_kit.commands.output import emit_json
from trtllm_kit.errors import KitError

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).


@click.group()
def artifact() -> None:
    """Check build artifacts (directories or archives made with --archive).

    \b
    Example:
      trtllm-kit artifact verify out.tar --hashes-only
      trtllm-kit artifact upgrade out/
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
    from trtllm_kit.artifact.archive import verdict, verify_artifact
    from trtllm_kit.artifact.machine import detect_machine
    from trtllm_kit.targets import get_target

    machine = detect_machine()
    report = verify_artifact(path, lambda artifact: get_target(artifact.target).serve_problems(artifact, machine))
    if as_json:
        emit_json(report.to_dict())
    else:
        engines = ("engines compatible with this machine" if not report.problems else
                   f"engines not runnable here: {'; '.join(report.problems)}") if report.has_engines else "no engines"
        click.echo(f"{report.num_files} files checked, hashes {'ok' if report.hashes_ok else 'DIFFER'}; {engines}")
    failure = verdict(report, hashes_only=hashes_only)
    if failure:
        raise KitError(failure)


@artifact.command(name="upgrade")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the schema versions before and after as JSON.")
def artifact_upgrade(out: Path, as_json: bool) -> None:
    """Rewrite OUT/manifest.json written by an older trtllm-kit in this kit's schema (the files stay as built).

    \b
    Example:
      trtllm-kit artifact upgrade out/ && trtllm-kit artifact verify out/
    """
    from trtllm_kit.artifact import upgrade_manifest

    old, new = upgrade_manifest(out)
    if as_json:
        emit_json({"manifest": str(out / "manifest.json"), "from": old, "to": new})
    else:
        click.echo(f"{out}/manifest.json: schema_version {old} → {new}" if old != new else
                   f"{out}/manifest.json is already schema_version {new}; nothing to do")


@click.command()
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
    from trtllm_kit.model_repo.llmapi_validate import is_llmapi_repository, llmapi_report
    from trtllm_kit.model_repo.validate import print_report, validate_repository
    from trtllm_kit.targets import limits_from_dir

    if (repo / "repo").is_dir() and not (repo / "config.pbtxt").exists():
        repo = repo / "repo"
    report = (llmapi_report(repo) if is_llmapi_repository(repo)
              else validate_repository(repo, read_limits=limits_from_dir))
    if as_json:
        emit_json(report.to_dict())
    else:
        print_report(report)
    if report.errors:
        raise KitError(f"{len(report.errors)} error(s) in {repo}; Triton would refuse or misserve it: fix them "
                       "(or rebuild) and validate again.")


@click.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--against", "hf_source", help="The HF model: a directory, builtin:NAME or repo id (default: the "
              "source recorded in the build's manifest.json).")
@click.option("--compute-dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Precision of both forward passes.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(checkpoint: Path, hf_source: str | None, compute_dtype: str, as_json: bool) -> None:
    """Run a TensorRT-LLM CHECKPOINT (or a build's output directory) on the CPU, rank by rank, and compare
    its logits with transformers.

    \b
    Example:
      trtllm-kit verify out/
      trtllm-kit verify out/checkpoint --against builtin:tiny-llama
    """
    from trtllm_kit.artifact.files import checkpoint_dir
    from trtllm_kit.checkpoint.verify import CACHED_REFERENCE, recorded_source, verify_checkpoint
    from trtllm_kit.errors import VerifyError
    from trtllm_kit.llmapi.load import unified_loader
    from trtllm_kit.models.inspect import resolve_model_path

    hf_source = hf_source or recorded_source(checkpoint)
    ckpt = checkpoint_dir(checkpoint)
    report = verify_checkpoint(ckpt, resolve_model_path(hf_source), compute_dtype=compute_dtype,
                               load=unified_loader(ckpt))  # the llmapi target's unified checkpoint brings its loader
    if as_json:
        emit_json(report.to_dict())
    else:
        if report.reference_cached:
            click.echo(CACHED_REFERENCE)
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


@click.command(name="inspect")
@click.argument("model")
@spec_options(declared_fields("build", "quant", only=("build.tp", "build.pp", "build.dtype", "build.allow_pickle",
                                                      *(f"quant.{d.name}" for d in declared_fields("quant"))),
                              top_level=False), config=False)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
def inspect_command(ctx: click.Context, model: str, as_json: bool, **_flags: Any) -> None:
    """Show what MODEL is and what a build at --tp/--pp would write, without converting.

    \b
    Example:
      trtllm-kit inspect builtin:tiny-qwen2 --tp 4 --pp 2
    """
    from trtllm_kit.build.describe import describe_build, print_description
    from trtllm_kit.commands.build_flags import typed_values
    from trtllm_kit.spec import BuildOptions, QuantOptions

    flags = typed_values(ctx)
    layout, quant = BuildOptions(**flags.get("build", {})), QuantOptions(**flags.get("quant", {}))
    description = describe_build(model, layout.tp, layout.pp, layout.dtype, allow_pickle=layout.allow_pickle,
                                 quant=quant.quant_config())
    if as_json:
        emit_json(description)
    else:
        print_description(description)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def models(as_json: bool) -> None:
    """List the built-in models (tiny random ones, trained ones from the package index) and the supported families.

    \b
    Example:
      trtllm-kit models --json
    """
    from trtllm_kit.models.builtin import builtin_descriptions
    from trtllm_kit.models.registry import FAMILIES

    listing: dict[str, dict[str, Any]] = {
        "builtin": builtin_descriptions(),
        "families": {f.name: list(f.architectures) for f in FAMILIES},
    }
    if as_json:
        emit_json(listing)
        return
    click.echo("Built-in models (tiny ones generated locally, trained ones fetched from the package index, on first "
               "use):")
    for name, description in listing["builtin"].items():
        click.echo(f"  {name:<22} {description}")
    click.echo("Families:")
    for name, architectures in listing["families"].items():
        click.echo(f"  {name:<22} {', '.join(architectures)}")
