"""The ``[repo]`` options resolved against the engine's limits: every ``None`` filled in, every explicit value
checked."""

from __future__ import annotations

import os
from dataclasses import replace

from trtllm_kit.artifact import EngineLimits
from trtllm_kit.defaults import DEFAULT_KV_CACHE_FRACTION
from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec.repo_options import QUEUE_BATCHES, RepoOptions

MIN_INSTANCES = 5  # the backend docs advise about 5 pre/post/BLS instances, or the batch size; never 1 by default
MAX_DEFAULT_INSTANCES = 16
# ... and never more than the build machine's cores: each instance is a Python process that starts, and ends, one
# at a time with the server (8 instances of 3 models on 2 cores took 7-9 s to start and Triton's whole exit
# timeout to stop); the decoupled BLS runs each request in its own thread, so its instances do not bound the load.


def resolve_options(options: RepoOptions, limits: EngineLimits, plan_fraction: float | None = None, *,
                    num_cpus: int | None = None) -> RepoOptions:
    """Fill every ``None`` from the engine, the plan and the machine, and check the explicit values against them.

    Arguments:
        options: the chosen options;
        limits: what the engine (or the CPU runtime) was built for;
        plan_fraction: the KV-cache memory fraction the build plan sized ``max_batch_size`` with, if any;
        num_cpus: the cores that bound the default instance counts (this machine's when omitted).
    """
    fraction = options.kv_cache_free_gpu_mem_fraction
    if fraction is not None and plan_fraction is not None and float(fraction) != float(plan_fraction):
        raise KitUsageError(f"kv_cache_free_gpu_mem_fraction {fraction} differs from the build plan's "
                            f"kv_cache_fraction {plan_fraction}, which sized max_batch_size; set them equal.")
    fraction = fraction if fraction is not None else (plan_fraction if plan_fraction is not None else
                                                      DEFAULT_KV_CACHE_FRACTION)
    paged = limits.use_paged_context_fmha
    for name in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if getattr(options, name) and not paged:
            raise KitUsageError(f"{name} needs an engine built with use_paged_context_fmha, but "
                                f"{limits.model_dir}/config.json has it disabled; rebuild with "
                                f"--use_paged_context_fmha enable or set {name} = false.")
    blocks = -(-limits.max_batch_size * limits.max_seq_len // limits.tokens_per_block)
    kv_tokens = options.max_tokens_in_paged_kv_cache or blocks * limits.tokens_per_block
    if kv_tokens < limits.max_seq_len:
        raise KitUsageError(f"max_tokens_in_paged_kv_cache {kv_tokens} is below max_seq_len "
                            f"{limits.max_seq_len}: one full-length sequence would not fit; raise it.")
    num_cpus = num_cpus or os.cpu_count() or 1
    instances = min(max(MIN_INSTANCES, min(limits.max_batch_size, MAX_DEFAULT_INSTANCES)), num_cpus)
    queue = QUEUE_BATCHES * limits.max_batch_size if options.max_queue_size is None else options.max_queue_size
    return replace(
        options, kv_cache_free_gpu_mem_fraction=float(fraction), max_tokens_in_paged_kv_cache=kv_tokens,
        max_queue_size=queue,
        enable_kv_cache_reuse=paged if options.enable_kv_cache_reuse is None else options.enable_kv_cache_reuse,
        enable_chunked_context=paged if options.enable_chunked_context is None else options.enable_chunked_context,
        preprocessing_instances=options.preprocessing_instances or instances,
        postprocessing_instances=options.postprocessing_instances or instances,
        bls_instances=options.bls_instances or instances)
