"""``trtllm-kit plan`` (= ``build --dry-run``): the memory plan, every stage with its cache status, the exact
``trtllm-build`` command and the fused layer, without converting or compiling anything.

Only the model's ``config.json`` is needed for the memory plan, so a model can be planned before its weights
are downloaded; the stage cache status needs the weights (their digests are part of the keys).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from trtllm_kit.artifact.machine import detect_machine
from trtllm_kit.build.cache import Previous, input_digests
from trtllm_kit.build.compile_stage import prepare_compile
from trtllm_kit.build.pipeline import stage_keys
from trtllm_kit.checkpoint.fusion_graph import fusion_table, layer_graph, write_graph
from trtllm_kit.checkpoint.trtllm_config import precision_of
from trtllm_kit.errors import KitError
from trtllm_kit.llmapi.plan_report import print_llmapi_plan
from trtllm_kit.lora.settings import base_config, cache_memory
from trtllm_kit.mapping import check_tp, layers_for_rank
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.models.inspect import inspect_model, resolve_model_path
from trtllm_kit.models.registry import family_for
from trtllm_kit.quant.calib_size import calibration_device, calibration_memory, choose_size
from trtllm_kit.spec import STAGES, BuildSpec
from trtllm_kit.spec.draft_tokenizer import check_draft
from trtllm_kit.spec.roofline import TENSOR_CORE_NAMES, roofline
from trtllm_kit.spec.speculative_speedup import speculation_report
from trtllm_kit.targets.base import EngineSetup

MIB = 2**20
GIB = 2**30


def dry_run(spec: BuildSpec, graph: Path | None = None) -> dict[str, Any]:
    """Everything a build would do, as data; raises ``KitUsageError`` when the plan does not fit.

    Arguments:
        spec: the build spec.
        graph: write the fused decoder layer as ONNX here.
    """
    path = resolve_model_path(spec.model)
    hf = read_hf_config(path)
    family = family_for(hf, spec.model)
    check_draft(spec.speculative, path)
    check_tp(hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size, spec.build.tp)
    layers_for_rank(hf.num_hidden_layers, spec.build.pp, 0)
    stages = STAGES[: STAGES.index(spec.build.until) + 1]
    engine = prepare_compile(spec, hf, family, detect_machine(), compile_requested="engine" in stages,
                            plan_only=True)
    report: dict[str, Any] = {
        "model": {"source": spec.model, "path": str(path), "architecture": hf.architecture,
                  "num_parameters": hf.num_parameters},
        "target": engine.target.name, "reason": engine.reason,
        "plan": engine.plan.to_dict() if engine.plan else None,
        "stages": _stage_status(spec, stages, engine),
        "commands": [engine.command.argv] if engine.command else [],
        "command_lines": [engine.command.line] if engine.command else [],
    }
    gpu = engine.plan.gpu if engine.plan else engine.build_gpu  # the GPU the memory plan is for
    speculation = speculation_report(spec.speculative, hf, spec.build.tp,
                                     roofline(gpu, precision_of(spec, hf)) if gpu is not None else None)
    if speculation is not None:  # the verify step's time model (spec/speculative_speedup.py)
        report["speculation"] = speculation
    if engine.draft is not None:  # draft-target: the draft engine's trtllm-build, run after the target's
        report["draft_command"], report["draft_command_line"] = engine.draft.command.argv, engine.draft.command.line
    if engine.lora is not None:
        cache = cache_memory(engine.lora, base_config(hf), precision_of(spec, hf).dtype)
        report["lora"] = {**asdict(engine.lora), "cache": cache.to_dict()}
    if spec.quant_config().needs_calibration:
        size = choose_size(spec.quant_config(), calibration_device())
        memory = calibration_memory(hf, size, spec.quant_config().calib_dtype, spec.quant_config().searches_awq)
        report["calibration"] = {"samples": size.samples, "seq_len": size.seq_len, "device": size.device,
                                 "reason": size.reason, "dtype": spec.quant_config().calib_dtype,
                                 "peak_bytes": memory.total_bytes, "layer_bytes": memory.layer_bytes,
                                 "activation_bytes": memory.activation_bytes, "kv_bytes": memory.kv_bytes,
                                 "search_bytes": memory.search_bytes}
    own = engine.target.own_plan(spec, hf, family, precision_of(spec, hf), engine.build_gpu, engine.lora)
    if own is not None:  # no engine: the target's recipe, memory and serve command (llmapi)
        report[engine.target.name] = own
        report.update(plan=None, commands=[], command_lines=[])
        if graph is not None:
            raise KitError(f"--graph draws the engine's fused layer; target {engine.target.name} builds no engine.")
    elif engine.command is not None:
        layer = layer_graph(hf, precision_of(spec, hf), spec.build.tp, dict(engine.command.flags))
        report["fusion"] = fusion_table(layer)
        if graph is not None:
            report["graph"] = str(write_graph(layer, graph))
    elif graph is not None:
        raise KitError("--graph needs the trtllm-build flags, which need a GPU to plan for: pass --gpu NAME or "
                       "--gpu-memory GiB.")
    return report


def _stage_status(spec: BuildSpec, stages: tuple[str, ...], engine: EngineSetup) -> list[dict[str, Any]]:
    try:
        model = inspect_model(spec.model, allow_pickle=spec.build.allow_pickle)
    except KitError as exc:
        return [{"stage": name, "status": "cannot build", "why": str(exc)} for name in stages]
    previous = Previous.load(spec.out, force=spec.build.force)
    if previous.artifact is None:  # nothing to reuse: do not hash the weights just to say so
        why = "--force" if spec.build.force else f"no earlier build in {spec.out}"
        return [{"stage": name, "status": "will build", "why": why} for name in stages]
    digests = input_digests([model.path / "config.json", *model.weight_files], previous)
    keys = stage_keys(spec, model, digests, engine)
    rows = []
    for name in stages:
        cached = previous.can_reuse(name, keys[name])
        rows.append({"stage": name, "status": "cached" if cached else "will build", "key": keys[name],
                     "why": "same key in the earlier build" if cached else
                     f"key changed (was {previous.key(name) or 'absent'})"})
    if "engine" in stages and not engine.target.compiles:
        rows[stages.index("engine")]["status"] += f" (no compile: target {engine.target.name})"
    return rows


def print_dry_run(report: dict[str, Any], console: Console | None = None) -> None:
    """Print ``dry_run`` output: limits, a per-rank memory table, stages, commands and the fused layer."""
    console = console or Console(width=max(Console().width, 160), markup=False, highlight=False)
    model = report["model"]
    count = model["num_parameters"]
    size = f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"
    console.print(f"{model['source']}: {model['architecture']}, {size} parameters; "
                  f"{report['reason']}", highlight=False, markup=False)
    plan = report["plan"]
    if report.get("llmapi"):
        print_llmapi_plan(report, console)
    elif plan is None:
        console.print("Memory plan: no GPU known (none visible); pass --gpu NAME or --gpu-memory GiB.", markup=False)
    else:
        gpu, precision = plan["gpu"], plan["precision"]
        derived = set(plan["derived"])
        limits = ", ".join(f"{k} {plan[k]}{' (planned)' if k in derived else ''}" for k in
                           ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"))
        console.print(f"Plan for {gpu['name']} ({gpu['memory_bytes'] / GIB:.1f} GiB, SM {gpu['compute_capability']}, "
                      f"from {gpu['source']}): {precision['dtype']}, quant {precision['quant_algo'] or 'none'}, KV "
                      f"{precision['kv_dtype']}, tp={plan['tp_size']} pp={plan['pp_size']}; {limits}; "
                      f"tokens_per_block {plan['tokens_per_block']}, kv_cache_fraction {plan['kv_cache_fraction']}",
                      highlight=False, markup=False)
        table = Table("rank", "layers", "weights GiB", "KV/token KiB", "block MiB", "activ. GiB", "buffers GiB",
                      "left GiB", "KV pool GiB", "blocks", f"seqs@{plan['max_seq_len']}", "verdict")
        for r in plan["ranks"]:
            table.add_row(str(r["rank"]), str(r["num_layers"]), f"{r['weight_bytes'] / GIB:.2f}",
                          f"{r['kv_bytes_per_token'] / 1024:g}", f"{r['block_bytes'] / MIB:g}",
                          f"{r['activation_bytes'] / GIB:.2f}", f"{r['buffer_bytes'] / GIB:.2f}",
                          f"{r['free_bytes'] / GIB:.2f}", f"{r['kv_pool_bytes'] / GIB:.2f}", str(r["num_blocks"]),
                          str(r["max_sequences"]), "fits" if r["fits"] else "DOES NOT FIT")
        console.print(table)
        if plan.get("context_logits"):
            context = max(r["context_logits_bytes"] for r in plan["ranks"])
            console.print(f"Context logits (--gather_context_logits, [build] context_logits): "
                          f"{context / GIB:.2f} GiB per rank (max_num_tokens {plan['max_num_tokens']} x vocab x 4 "
                          "bytes), taken from the KV pool", highlight=False, markup=False)
    if report.get("lora"):
        lora, cache = report["lora"], report["lora"]["cache"]
        console.print(f"LoRA cache ({report['target']}): {cache['max_loras']} adapters x "
                      f"{cache['adapter_bytes'] / MIB:.2f} MiB = {cache['total_bytes'] / MIB:.2f} MiB (each at rank "
                      f"{cache['max_lora_rank']} on {', '.join(lora['target_modules'])} in every layer, "
                      f"{cache['dtype']}; --max-loras, --max-lora-rank)", highlight=False, markup=False,
                      soft_wrap=True)
    if report.get("calibration"):
        c = report["calibration"]
        console.print(f"Calibration: {c['samples']} windows x {c['seq_len']} tokens on {c['device']}: {c['reason']}",
                      highlight=False, markup=False)
        console.print(f"Calibration peak memory on {c['device']}: {c['peak_bytes'] / GIB:.2f} GiB, one decoder layer "
                      f"at a time in {c['dtype']} (layer weights {c['layer_bytes'] / GIB:.2f} + activations "
                      f"{c['activation_bytes'] / GIB:.2f} + one layer's KV {c['kv_bytes'] / GIB:.2f} GiB"
                      + (f" + AWQ scale search {c['search_bytes'] / GIB:.2f} GiB" if c.get("search_bytes") else "")
                      + ")",
                      highlight=False, markup=False)
    if report.get("speculation"):
        s = report["speculation"]
        speedups = ", ".join(f"{length}: {x:.2f}x" for length, x in s["predicted_speedup"].items())
        console.print(f"Speculation (K {s['draft_len']}, a draft step {s['draft_cost']:.3f} of the target's): pays "
                      f"above acceptance length {s['break_even_acceptance_length']:.2f}; predicted speedup at batch 1 "
                      f"by acceptance length {speedups}", highlight=False, markup=False, soft_wrap=True)
        if s.get("roofline"):
            console.print(roofline_line(s["roofline"]), highlight=False, markup=False, soft_wrap=True)
    stages = Table("stage", "status", "why")
    for row in report["stages"]:
        stages.add_row(row["stage"], row["status"], row["why"])
    console.print(stages)
    for line in report["command_lines"]:
        console.print(f"trtllm-build command (run in the artifact directory):\n  {line}", highlight=False,
                      soft_wrap=True, markup=False)
    if report.get("draft_command_line"):
        console.print(f"the draft's trtllm-build command (after the target's):\n  {report['draft_command_line']}",
                      highlight=False, soft_wrap=True, markup=False)
    if report.get("fusion"):
        fusion = Table("node", "op", "shape", "why")
        for row in report["fusion"]:
            fusion.add_row(row["node"], row["op"], str(row["shape"] or ""), row["why"])
        console.print(fusion)
    if report.get("graph"):
        console.print(f"wrote {report['graph']} (one decoder layer; open it in Netron)", highlight=False, markup=False)


def roofline_line(entry: dict[str, Any]) -> str:
    """The printed lines of the speculation entry's ``roofline`` (``spec/speculative_speedup.roofline_report``)."""
    if entry["knee_tokens"] is None:
        return (f"Speculation by batch size on {entry['gpu']}: not predicted: {entry['unknown']}; the speedups above "
                f"are batch 1's ({entry['model']}).")
    rows = [f"  batch {batch}: " + ", ".join(f"{length}: {x:.2f}x" for length, x in speedups.items())
            for batch, speedups in entry["predicted_speedup_by_batch_size"].items()]
    stops = ", ".join(f"{length}: {'never' if batch is None else batch}"
                      for length, batch in entry["stops_paying_at_batch_size"].items())
    return "\n".join([
        f"Speculation by batch size on {entry['gpu']} ({TENSOR_CORE_NAMES[entry['tensor_cores']]} tensor cores "
        f"{entry['peak_flops'] / 1e12:g} TFLOP/s over {entry['memory_bandwidth'] / 1e12:g} TB/s, "
        f"{entry['bytes_per_weight']:g} bytes a weight: a step turns compute-bound at {entry['knee_tokens']:g} tokens; "
        f"{entry['model']}), predicted speedup by acceptance length:", *rows,
        f"  stops paying (below 1x) from batch size, by acceptance length: {stops}"])
