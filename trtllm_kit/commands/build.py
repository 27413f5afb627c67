"""``build`` and ``plan``: flags and ``trtllm-kit.toml`` → BuildSpec → the pipeline (or its dry run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtllm_kit.commands.build_flags import SHARED_FLAGS, declared_fields, spec_options, typed_values
from trtllm_kit.commands.output import emit_json, reporter_for
from trtllm_kit.errors import KitUsageError

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).

SPEC_TABLES = ("build", "quant", "repo", "speculative")


def spec_sources(ctx: click.Context, config_file: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config file's values and the flags the user gave, both nested, as ``build_spec`` takes them.

    Arguments:
        ctx: the command's context; config_file: ``--config`` or None.
    """
    from trtllm_kit.spec import load_toml

    return (load_toml(config_file) if config_file else {}), typed_values(ctx)


@click.command()
@spec_options(declared_fields(*SPEC_TABLES), shared=SHARED_FLAGS)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest path and a summary as JSON.")
@click.option("--dry-run", is_flag=True, help="Print the plan (trtllm-kit plan) and build nothing.")
@click.pass_context
def build(ctx: click.Context, config_file: Path | None, as_json: bool, dry_run: bool, **_flags: Any) -> None:
    """Convert MODEL (a directory, builtin:NAME or a repo id in the local HF cache).

    \b
    Example:
      trtllm-kit build builtin:tiny-llama --tp 2 --pp 2 --until checkpoint --out out/
      trtllm-kit build builtin:tiny-llama --quant fp8 --kv-cache fp8 --tp 2 --until checkpoint --out out-fp8/
    """
    from trtllm_kit.build.cache import BackgroundDigests, Previous, likely_inputs
    from trtllm_kit.spec import build_spec

    file_values, flags = spec_sources(ctx, config_file)
    if dry_run:  # as plan: --out only names the artifact whose stage cache is checked
        file_values.setdefault("out", Path("out"))
        _print_plan(build_spec(file_values, flags), None, as_json)
        return
    spec = build_spec(file_values, flags)
    inputs = likely_inputs(spec.model, spec.quant.calib_data)
    with BackgroundDigests(inputs, Previous.load(spec.out, force=spec.build.force)) as early:
        from trtllm_kit.build.pipeline import run_build  # torch, while the inputs hash

        result = run_build(spec, reporter_for(as_json), early)
    if as_json:
        emit_json(result.summary)
    else:
        click.echo(f"wrote {result.out_dir} (manifest: {result.manifest_path})")


@click.command()
@spec_options(declared_fields(*SPEC_TABLES, skip=("build.force", "build.archive")), shared=SHARED_FLAGS)
@click.option("--graph", type=click.Path(path_type=Path), help="Write one decoder layer as the engine will run it "
              "(ONNX; opens in Netron).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--disagg", is_flag=True, help="Recommend aggregated or disaggregated serving and the prefill:decode "
              "ratio for a workload (modelled from the memory plan and the GPU's roofline).")
@click.option("--isl", type=int, default=4096, show_default=True, help="Input tokens per request (--disagg).")
@click.option("--osl", type=int, default=512, show_default=True, help="Output tokens per request (--disagg).")
@click.option("--ttft-slo", type=float, default=1000.0, show_default=True, help="Time to first token target, ms "
              "(--disagg).")
@click.option("--itl-slo", type=float, default=50.0, show_default=True, help="Inter-token latency target, ms "
              "(--disagg).")
@click.option("--phases", "phases_file", type=click.Path(path_type=Path), help="Per-phase figures measured by "
              "trtllm-kit bench --phases (its phases.json) instead of the modelled ones (--disagg).")
@click.option("--cold-start", is_flag=True, help="Plan a replica's start instead, phase by phase (what trtllm-kit "
              "bench cold-start measures here), and the read rate an 8B model needs to start under 30 s.")
@click.option("--load-gbps", type=float, default=0.5, show_default=True, help="The volume's read rate in GB/s "
              "(--cold-start).")
@click.pass_context
def plan(ctx: click.Context, config_file: Path | None, graph: Path | None, as_json: bool, disagg: bool, isl: int,
         osl: int, ttft_slo: float, itl_slo: float, phases_file: Path | None, cold_start: bool, load_gbps: float,
         **_flags: Any) -> None:
    """Plan a build of MODEL without doing it: per-rank memory, KV capacity, stages with their cache status,
    the exact trtllm-build command and the fused decoder layer. Only the model's config.json is needed.

    \b
    Example:
      trtllm-kit plan builtin:tiny-llama --gpu L4 --graph layer.onnx
      trtllm-kit plan ./Meta-Llama-3-70B --gpu H100-80GB --tp 4 --kv-cache fp8 --json
      trtllm-kit plan ./Meta-Llama-3-8B --gpu H100 --disagg --isl 4096 --osl 512 --ttft-slo 1000 --itl-slo 50
      trtllm-kit plan builtin:tiny-llama --disagg --phases results/phases.json --isl 512 --osl 64
    """
    from trtllm_kit.spec import build_spec

    file_values, flags = spec_sources(ctx, config_file)
    file_values.setdefault("out", Path("out"))
    spec = build_spec(file_values, flags)
    if phases_file is not None and not disagg:
        raise KitUsageError("--phases feeds the disaggregation plan; add --disagg.")
    if cold_start:
        _print_cold_start(spec, load_gbps, as_json)
    elif disagg:
        _print_disagg(spec, isl, osl, ttft_slo, itl_slo, as_json, phases_file)
    else:
        _print_plan(spec, graph, as_json)


def _print_disagg(spec: Any, isl: int, osl: int, ttft_ms: float, itl_ms: float, as_json: bool,
                  phases_file: Path | None) -> None:
    from trtllm_kit.checkpoint.trtllm_config import precision_of
    from trtllm_kit.disagg_plan import MeasuredPhases, Workload, describe, plan_disagg, plan_measured
    from trtllm_kit.gpus import resolve_gpu
    from trtllm_kit.models.hf_config import read_hf_config
    from trtllm_kit.models.inspect import resolve_model_path

    work = Workload(isl, osl, ttft_ms / 1e3, itl_ms / 1e3)
    if phases_file is not None:
        result = plan_measured(MeasuredPhases.read(phases_file), work)
    else:
        hf = read_hf_config(resolve_model_path(spec.model))
        gpu = resolve_gpu(spec.build.gpu, None, [])
        if gpu is None:
            raise KitUsageError("plan --disagg models a GPU from its datasheet; name it with --gpu (e.g. --gpu "
                                "H100), or pass measured figures with --phases FILE.")
        result = plan_disagg(hf, precision_of(spec, hf), gpu, work)
    if as_json:
        emit_json({"workload": {"isl": isl, "osl": osl, "ttft_slo_ms": ttft_ms, "itl_slo_ms": itl_ms},
                   **result.to_dict()})
    else:
        click.echo("\n".join(describe(result, work)))


def _print_plan(spec: Any, graph: Path | None, as_json: bool) -> None:
    from trtllm_kit.build.dry_run import dry_run, print_dry_run

    report = dry_run(spec, graph)
    if as_json:
        emit_json(report)
    else:
        print_dry_run(report)


def _print_cold_start(spec: Any, load_gbps: float, as_json: bool) -> None:
    from trtllm_kit.models.inspect import inspect_model
    from trtllm_kit.profile.cold_start_plan import LLAMA_8B_BYTES, describe, plan_cold_start

    if load_gbps <= 0:
        raise KitUsageError(f"--load-gbps {load_gbps} must be a positive read rate in GB/s, e.g. 2.")
    target = spec.build.target.value if spec.build.target.value != "auto" else "engine"
    planned = plan_cold_start(inspect_model(spec.model).weight_bytes, target, load_gbps)
    eight_b = plan_cold_start(LLAMA_8B_BYTES, target, load_gbps)
    if as_json:
        emit_json({"target": target, **planned.to_dict(), "llama_8b": eight_b.to_dict()})
    else:
        click.echo("\n".join(describe(planned, eight_b)))
