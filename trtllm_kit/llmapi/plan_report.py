"""What ``plan --target llmapi`` (and ``build --dry-run``) reports: the PyTorch-backend recipe with its reasons,
the ``TorchLlmArgs`` it writes, the memory of each rank (weights after load-time sharding, the CUDA-graph pool,
the KV pool) and the ``trtllm-serve`` command; no engine plan and no ``trtllm-build`` line, since this path
compiles nothing. Works on any machine: without a GPU the weights per rank are still exact."""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console
from rich.table import Table

from trtllm_kit.artifact import LoraRecord
from trtllm_kit.gpus import GPU
from trtllm_kit.llmapi.recipe import cuda_graph_batch_sizes, make_recipe
from trtllm_kit.llmapi.serve_config import OPTIONS_FILE, serve_argv
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.names import SERVE_DIR
from trtllm_kit.plan import rank_weight_bytes
from trtllm_kit.precision import Precision
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.gpu_groups import describe, parse_gpu_device_ids

GIB = 2**30
MIB = 2**20


def llmapi_plan(spec: BuildSpec, hf: HFConfig, family: Family, precision: Precision, gpu: GPU | None,
                lora: LoraRecord | None = None) -> dict[str, Any]:
    """The recipe, its memory figures per rank and the serve command, as data.

    Arguments:
        spec: the build spec; hf: model config; family: weight table; precision: dtype and quantization;
        gpu: the GPU planned for (``--gpu``, ``--gpu-memory`` or the visible one), or None;
        lora: the build's LoRA support, or none.
    """
    recipe = make_recipe(spec, hf, family, precision, gpu, lora)
    mapping = Mapping(spec.build.tp, spec.build.pp)
    weights = rank_weight_bytes(hf, family, mapping, precision)
    ranks: list[dict[str, Any]] = []
    for rank in mapping.ranks():
        row: dict[str, Any] = {"rank": rank, "tp_rank": mapping.tp_rank(rank), "pp_rank": mapping.pp_rank(rank),
                               "weight_bytes": weights[rank]}
        if recipe.plan is not None:
            r = recipe.plan.ranks[rank]
            row.update(num_layers=r.num_layers, cuda_graph_pool_bytes=recipe.cuda_graph_pool_bytes,
                       activation_bytes=r.activation_bytes, buffer_bytes=r.buffer_bytes, kv_pool_bytes=r.kv_pool_bytes,
                       block_bytes=r.block_bytes, num_blocks=r.num_blocks, max_sequences=r.max_sequences, fits=r.fits)
        ranks.append(row)
    out = spec.out.absolute()
    argv = serve_argv(out / "checkpoint", out / SERVE_DIR / OPTIONS_FILE)
    ids = spec.repo.gpu_device_ids
    groups = parse_gpu_device_ids(ids) if ids is not None else ()
    instances = describe(groups) if groups else ("one tensorrt_llm instance on the visible GPUs (--gpu-device-ids "
                                                 "0,1;2,3 runs one LLM per group of tp x pp GPUs)")
    return {"llm_args": recipe.args, "notes": list(recipe.notes), "ranks": ranks, "instances": instances,
            "gpu_device_ids": [list(g) for g in groups],
            "cuda_graph_batch_sizes": cuda_graph_batch_sizes(recipe.args["max_batch_size"]),
            "cuda_graph_pool_bytes": recipe.cuda_graph_pool_bytes,
            "gpu": gpu.to_dict() if gpu is not None else None, "serve_command": argv}


def print_llmapi_plan(report: dict[str, Any], console: Console) -> None:
    """Print the ``llmapi`` part of a dry run: recipe and reasons, memory per rank, settings, serve command.

    Arguments:
        report: ``dry_run``'s output with its ``llmapi`` entry; console: where to print.
    """
    body = report["llmapi"]
    args, gpu = body["llm_args"], body["gpu"]
    console.print("Recipe (PyTorch backend; weights are sharded by the LLM at load time, nothing is compiled):")
    for note in body["notes"]:
        console.print(f"  - {note}", markup=False, highlight=False)
    if gpu is None:
        console.print("Memory per rank: no GPU known (none visible), so only the weights are planned; pass --gpu NAME "
                      "or --gpu-memory GiB for the CUDA-graph and KV pools.", markup=False)
        table = Table("rank", "tp", "pp", "weights GiB")
        for r in body["ranks"]:
            table.add_row(str(r["rank"]), str(r["tp_rank"]), str(r["pp_rank"]), f"{r['weight_bytes'] / GIB:.3f}")
    else:
        console.print(f"Memory per rank on {gpu['name']} ({gpu['memory_bytes'] / GIB:.1f} GiB, SM "
                      f"{gpu['compute_capability']}): the CUDA-graph pool is set aside, then the KV pool takes "
                      f"{args['kv_cache_config']['free_gpu_memory_fraction']} of what is left", markup=False)
        table = Table("rank", "layers", "weights GiB", "CUDA graphs MiB", "activ. GiB", "buffers GiB", "KV pool GiB",
                      "blocks", f"seqs@{args['max_seq_len']}", "verdict")
        for r in body["ranks"]:
            table.add_row(str(r["rank"]), str(r["num_layers"]), f"{r['weight_bytes'] / GIB:.3f}",
                          f"{r['cuda_graph_pool_bytes'] / MIB:.0f}", f"{r['activation_bytes'] / GIB:.2f}",
                          f"{r['buffer_bytes'] / GIB:.2f}", f"{r['kv_pool_bytes'] / GIB:.2f}", str(r["num_blocks"]),
                          str(r["max_sequences"]), "fits" if r["fits"] else "DOES NOT FIT")
    console.print(table)
    settings = ", ".join(f"{k} {args[k]}" for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                                     "max_batch_size", "max_num_tokens", "max_seq_len"))
    console.print(f"TorchLlmArgs: {settings}; kv_cache_config {args['kv_cache_config']}", markup=False,
                  highlight=False, soft_wrap=True)
    console.print(f"Instances: {body['instances']}; the memory above is per instance.", markup=False,
                  highlight=False, soft_wrap=True)
    console.print(f"trtllm-serve command (written to {SERVE_DIR}/command.sh):\n  "
                  f"{shlex.join(map(str, body['serve_command']))}", markup=False, highlight=False, soft_wrap=True)

