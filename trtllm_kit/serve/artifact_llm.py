"""A cpu or llmapi artifact loaded into the kit's CPU ``LLM`` (``llmapi/cpu_llm.py``) with the settings it was
built for (a cpu artifact's KV pool, ``max_tokens_in_paged_kv_cache``, and its block reuse, as its Triton model
runs them, and its speculation: ``ngram`` or ``draft-target`` as the ``speculative_config`` of the mode its
``tensorrt_llm`` model runs, the draft from the artifact's ``draft_checkpoint/``), computing with the runtime's default
torch threads (``runtime/threads.py``): what a Dynamo worker and a Ray Serve replica run in-process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.records import EngineLimits, LlmapiRepoOptions
from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.cpu_llm import LLM
from trtllm_kit.runtime.threads import compute_with, default_threads
from trtllm_kit.spec.speculative_support import CPU_MODES, speculative_config


def artifact_llm(out: Path, *, event_buffer: int = 0) -> tuple[LLM, EngineLimits]:
    """The CPU ``LLM`` for OUT with the settings it was built for, computing with the runtime's default threads, and
    the artifact's limits.

    Arguments:
        out: a cpu or llmapi artifact.
        event_buffer: KV cache events the LLM keeps between two reads (``kv_cache_config.event_buffer_max_size``;
            0: none recorded).
    """
    artifact = Artifact.read(out)
    repo = artifact.records.repo
    if repo is None:
        raise KitUsageError(f"{out} has no repository record; build it with the repo stage.")
    limits = repo.limits
    events = {"event_buffer_max_size": event_buffer} if event_buffer else {}
    if isinstance(repo.options, LlmapiRepoOptions):
        args = dict(repo.options.llm_args)
        args["kv_cache_config"] = {**(args.get("kv_cache_config") or {}), **events}
        return _computing_with_default_threads(lambda: LLM(model=str(out / "checkpoint"), **args)), limits
    if limits.target != "cpu":
        raise KitUsageError(f"{out} is a {limits.target} artifact; the CPU LLM runs cpu and llmapi artifacts "
                            "(build with --target cpu or --target llmapi).")
    kv_cache = {"tokens_per_block": limits.tokens_per_block, "max_tokens": repo.options.max_tokens_in_paged_kv_cache,
                "enable_block_reuse": repo.options.enable_kv_cache_reuse is not False, **events}
    return _computing_with_default_threads(lambda: LLM(
        model=str(out / limits.model_dir), tensor_parallel_size=limits.tp_size, pipeline_parallel_size=limits.pp_size,
        max_batch_size=limits.max_batch_size, max_num_tokens=limits.max_num_tokens, max_seq_len=limits.max_seq_len,
        kv_cache_config=kv_cache, speculative_config=cpu_speculative_config(artifact))), limits


def _computing_with_default_threads(load: Callable[[], LLM]) -> LLM:
    """The LLM ``load`` makes, made after this process takes the runtime's default threads, its engine stepping with
    them."""
    threads = default_threads()
    compute_with(threads)  # before the load: torch takes its inter-op count once, before any inter-op work
    llm = load()
    llm.engine.step_threads = threads
    return llm


def cpu_speculative_config(artifact: Artifact) -> dict[str, Any] | None:
    """The CPU ``LLM``'s ``speculative_config`` for a cpu artifact: the mode its ``tensorrt_llm`` model runs itself
    (``speculative_support.cpu_parameters``), with the draft checkpoint the build converted; None without one.

    Arguments:
        artifact: a cpu artifact.
    """
    options = artifact.spec.speculative
    if options.mode not in CPU_MODES:
        return None
    engine = artifact.records.engine
    draft = None if engine is None or engine.draft is None else artifact.path / engine.draft.dir
    return speculative_config(options, draft)
