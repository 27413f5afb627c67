"""``trtllm-kit inspect``: what a model is and what a build at a given layout would write."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from trtllm_kit.checkpoint.convert import check_sources, work_items
from trtllm_kit.checkpoint.prequantized_checks import OWN_QUANT, trtllm_input_problem
from trtllm_kit.checkpoint.trtllm_config import resolve_dtype
from trtllm_kit.layout import QuantLayout, rank_tensors
from trtllm_kit.mapping import Mapping, check_tp, kv_heads_per_rank, layers_for_rank, pad_vocab_size
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.quant.algos import QuantConfig, check_model
from trtllm_kit.quant.prequantized import detect_prequantized


def describe_build(source: str, tp: int, pp: int, dtype: str = "auto", *, allow_pickle: bool = False,
                   quant: QuantConfig | None = None) -> dict[str, Any]:
    """The model's facts and the per-rank layout of a conversion, computed from headers only.

    Arguments:
        source: the model.
        tp: tensor-parallel size.
        pp: pipeline-parallel size.
        dtype: requested checkpoint dtype.
        allow_pickle: accept pickle weights.
        quant: the quantization (the layout shows its tensors and dtypes).
    """
    model = inspect_model(source, allow_pickle=allow_pickle)
    hf = model.hf
    mapping = Mapping(tp, pp)
    check_tp(hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size, tp)
    resolved = resolve_dtype(dtype, hf)
    items = work_items(model, mapping)
    prequantized = detect_prequantized(model.path)
    trtllm = {}  # target → "converted" or why it refuses the input
    if prequantized is None:  # a pre-quantized model's tensors are the format's, not the table's
        check_sources(model, items)
    else:  # the TensorRT-LLM checkpoint holds the input's quantization, where it can
        trtllm = {target: trtllm_input_problem(prequantized, model, quant, target) or "converted"
                  for target in ("engine", "cpu")}
        if trtllm["engine"] == "converted":
            quant = QuantConfig(quant=OWN_QUANT[prequantized.quant_algo],
                                kv_cache="fp8" if prequantized.kv_cache_quant_algo == "FP8" else "auto")
    quant = quant or QuantConfig()
    check_model(quant, hf, tp)
    layout = QuantLayout.from_dict(quant.quantization_block())
    ranks = []
    for rank in mapping.ranks():
        tensors = rank_tensors(hf, model.family, mapping, rank, layout, resolved)
        pp_rank = mapping.pp_rank(rank)
        layers = layers_for_rank(hf.num_hidden_layers, pp, pp_rank)
        nbytes = sum(spec.nbytes for spec in tensors.values())
        ranks.append({"rank": rank, "tp_rank": mapping.tp_rank(rank), "pp_rank": pp_rank,
                      "layers": [layers.start, layers.stop - 1], "num_tensors": len(tensors),
                      "bytes": nbytes})
    used = {name for item in items for name in item.sources}
    return {
        "source": model.source,
        "path": str(model.path),
        "family": model.family.name,
        "architecture": hf.architecture,
        "num_parameters": hf.num_parameters,
        "hf_dtype": hf.dtype,
        "weight_format": model.weight_format,
        "weight_bytes": model.weight_bytes,
        "weight_files": [p.name for p in model.weight_files],
        "tokenizer_files": [p.name for p in model.tokenizer_files],
        "input_quantization": None if prequantized is None else {
            "format": prequantized.label, "quant_algo": prequantized.quant_algo,
            "kv_cache_quant_algo": prequantized.kv_cache_quant_algo, "declared_in": prequantized.declared_in,
            "trtllm_checkpoint": trtllm},
        "config": {"hidden_size": hf.hidden_size, "intermediate_size": hf.intermediate_size,
                   "num_hidden_layers": hf.num_hidden_layers, "num_attention_heads": hf.num_attention_heads,
                   "num_key_value_heads": hf.num_key_value_heads, "head_dim": hf.head_dim,
                   "vocab_size": hf.vocab_size, "max_position_embeddings": hf.max_position_embeddings,
                   "rope_theta": hf.rope_theta, "rope_scaling": hf.rope_scaling,
                   "tie_word_embeddings": hf.tie_word_embeddings, "sliding_window": hf.sliding_window},
        "build": {"dtype": resolved, **mapping.to_dict(),
                  "kv_heads_per_rank": kv_heads_per_rank(hf.num_key_value_heads, tp),
                  "kv_heads_duplicated": hf.num_key_value_heads < tp,
                  "padded_vocab_size": pad_vocab_size(hf.vocab_size, tp), "ranks": ranks,
                  "quantization": quant.quantization_block(),
                  "needs_calibration": quant.needs_calibration and prequantized is None},
        "unused_tensors": sorted(set(model.tensors) - used),
    }


def print_description(d: dict[str, Any], console: Console | None = None) -> None:
    """Print ``describe_build`` output as a short report and a per-rank table."""
    console = console or Console()
    c, b = d["config"], d["build"]
    console.print(f"[bold]{d['source']}[/bold] ({d['path']})", highlight=False)
    console.print(f"  {d['family']} {d['architecture']}, {d['num_parameters'] / 1e6:.1f}M parameters, "
                  f"{d['hf_dtype']}, {d['weight_format']} {d['weight_bytes'] / 2**20:.1f} MiB in "
                  f"{len(d['weight_files'])} file(s)", highlight=False)
    console.print(f"  hidden {c['hidden_size']}, intermediate {c['intermediate_size']}, layers "
                  f"{c['num_hidden_layers']}, heads {c['num_attention_heads']}/{c['num_key_value_heads']} kv "
                  f"(head_dim {c['head_dim']}), vocab {c['vocab_size']}, rope theta {c['rope_theta']:g}"
                  + (f" scaling {c['rope_scaling'].get('rope_type')}" if c["rope_scaling"] else ""),
                  highlight=False)
    console.print(f"  tokenizer: {', '.join(d['tokenizer_files']) or 'none found'}", highlight=False)
    if d["input_quantization"]:
        q = d["input_quantization"]
        done = q["trtllm_checkpoint"]
        if done["engine"] == done["cpu"]:
            trtllm = "--target engine and cpu " + _verdict(done["cpu"], plural=True)
        else:
            trtllm = f"--target engine {_verdict(done['engine'])}; --target cpu {_verdict(done['cpu'])}"
        console.print(f"  pre-quantized: {q['format']} ({q['declared_in']}); --target llmapi serves it as it is, "
                      f"{trtllm}", highlight=False)
    console.print(f"Build: {b['dtype']}, tp={b['tp_size']} pp={b['pp_size']}, {b['kv_heads_per_rank']} KV "
                  f"head(s) per rank{' (duplicated)' if b['kv_heads_duplicated'] else ''}, lm_head vocab padded "
                  f"to {b['padded_vocab_size']}", highlight=False)
    q = b["quantization"]
    if q["quant_algo"] or q["kv_cache_quant_algo"]:
        console.print(f"Quantization: {q['quant_algo'] or 'none'}, KV cache {q['kv_cache_quant_algo'] or 'model dtype'}"
                      f"{' (calibrated)' if b['needs_calibration'] else ''}", highlight=False)
    table = Table("rank", "tp", "pp", "layers", "tensors", "MiB")
    for r in b["ranks"]:
        table.add_row(str(r["rank"]), str(r["tp_rank"]), str(r["pp_rank"]), f"{r['layers'][0]}–{r['layers'][1]}",
                      str(r["num_tensors"]), f"{r['bytes'] / 2**20:.1f}")
    console.print(table)
    if d["unused_tensors"]:
        console.print(f"Not converted: {', '.join(d['unused_tensors'][:8])}", highlight=False)


def _verdict(done: str, plural: bool = False) -> str:
    """``convert(s) it`` or ``refuse(s) it: why``."""
    if done == "converted":
        return "convert it" if plural else "converts it"
    return f"refuse it: {done}" if plural else f"refuses it: {done}"
