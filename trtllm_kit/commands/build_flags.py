"""The option groups of the [quant], [engine] and [repo] tables, shared by ``build``, ``plan`` and ``inspect``."""

from __future__ import annotations

from typing import Any

import click


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
        click.option("--target", type=click.Choice(["auto", "cpu", "engine", "llmapi"]), default="auto",
                     show_default=True, help="engine: compile with trtllm-build; cpu: no compile; llmapi: "
                     "TensorRT-LLM's PyTorch backend (unified HF checkpoint); auto: engine when a GPU and "
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
