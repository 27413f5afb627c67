"""The ``[repo]`` table: the repository settings a user chooses (each declared once; ``build`` flags are generated
from the declarations), validated, and their resolution against the engine's limits."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from trtllm_kit.defaults import DEFAULT_KV_CACHE_FRACTION
from trtllm_kit.enums import SchedulerPolicy
from trtllm_kit.errors import KitUsageError
from trtllm_kit.option import SharedFlag, check_declared, declared, option, plain

if TYPE_CHECKING:
    from trtllm_kit.model_repo.limits import EngineLimits

MIN_INSTANCES = 5  # the backend docs advise about 5 pre/post/BLS instances, or the batch size; never 1 by default
MAX_DEFAULT_INSTANCES = 16
# ... and never more than the build machine's cores: each instance is a Python process that starts, and ends, one
# at a time with the server (8 instances of 3 models on 2 cores took 7-9 s to start and Triton's whole exit
# timeout to stop); the decoupled BLS runs each request in its own thread, so its instances do not bound the load.
QUEUE_BATCHES = 4  # the default queue holds this many full batches beyond the running one


@dataclass(frozen=True)
class RepoOptions:
    """Settings of the generated repository; ``None`` means "derive from the engine and the plan"."""

    decoupled: bool = field(default=True, metadata=option(
        "Decoupled tensorrt_llm and BLS models, as stream=true needs.", "--streaming/--no-streaming"))
    # not a [repo] key: the build's kv_cache_fraction (or the plan's) fills it in ``resolve``
    kv_cache_free_gpu_mem_fraction: float | None = None
    max_tokens_in_paged_kv_cache: int | None = field(default=None, metadata=option(
        "KV pool cap in tokens (default: max_batch_size x max_seq_len).", "--max-tokens-in-paged-kv-cache",
        minimum=1))
    enable_kv_cache_reuse: bool | None = field(default=None, metadata=option(
        "Reuse KV blocks of shared prefixes (default: when the engine has paged context FMHA).",
        "--kv-cache-reuse/--no-kv-cache-reuse"))
    enable_chunked_context: bool | None = field(default=None, metadata=option(
        "Split long prompts into chunks (default: when the engine has paged context FMHA).",
        "--chunked-context/--no-chunked-context"))
    batch_scheduler_policy: SchedulerPolicy = field(default=SchedulerPolicy.GUARANTEED_NO_EVICT, metadata=option(
        "guaranteed_no_evict admits a request only when KV for its full length is guaranteed; max_utilization "
        "packs more and may pause some.", "--batch-scheduler-policy"))
    max_queue_size: int | None = field(default=None, metadata=option(
        f"Requests the engine queues beyond its running batch; more are refused (HTTP 429) at once (default: "
        f"{QUEUE_BATCHES} x max_batch_size; 0 = unbounded).", "--max-queue-size", minimum=0))
    max_queue_delay_microseconds: int = field(default=0, metadata=option(
        "Longest wait in the queue to form a batch.", "--max-queue-delay-us", minimum=0))
    exclude_input_in_output: bool = field(default=True, metadata=option(
        "Return only the generated tokens (config file only)."))
    preprocessing_instances: int | None = field(default=None, metadata=option(
        "Preprocessing instances (flag: --instances sets all three).", minimum=1))
    postprocessing_instances: int | None = field(default=None, metadata=option(
        "Postprocessing instances (flag: --instances).", minimum=1))
    bls_instances: int | None = field(default=None, metadata=option("BLS instances (flag: --instances).",
                                                                    minimum=1))
    gpu_device_ids: str | None = field(default=None, metadata=option(
        "llmapi target: run one tensorrt_llm instance (its own LLM) per ';'-separated group of tp x pp GPU ids, "
        "e.g. 0,1;2,3 (default: one instance on the visible GPUs).", "--gpu-device-ids", metavar="IDS"))

    def __post_init__(self) -> None:
        check_declared(self, "repo")
        if self.gpu_device_ids is not None:
            from trtllm_kit.llmapi.instances import parse_gpu_device_ids

            parse_gpu_device_ids(self.gpu_device_ids)  # refuses a malformed list before any work
        fraction = self.kv_cache_free_gpu_mem_fraction
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, int | float)
                                     or not 0 < fraction <= 1):
            raise KitUsageError(f"kv_cache_free_gpu_mem_fraction must be in (0, 1], got {fraction!r}.")

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> RepoOptions:
        """The options among ``values``; ``None`` values take the defaults.

        Arguments:
            values: any mapping, e.g. ``BuildSpec.to_dict()["repo"]``.
        """
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def resolve(self, limits: EngineLimits, plan_fraction: float | None = None, *,
                num_cpus: int | None = None) -> RepoOptions:
        """Fill every ``None`` from the engine, the plan and the machine, and check the explicit values against them.

        Arguments:
            limits: what the engine (or the CPU runtime) was built for;
            plan_fraction: the KV-cache memory fraction the build plan sized ``max_batch_size`` with, if any;
            num_cpus: the cores that bound the default instance counts (this machine's when omitted).
        """
        fraction = self.kv_cache_free_gpu_mem_fraction
        if fraction is not None and plan_fraction is not None and float(fraction) != float(plan_fraction):
            raise KitUsageError(f"kv_cache_free_gpu_mem_fraction {fraction} differs from the build plan's "
                                f"kv_cache_fraction {plan_fraction}, which sized max_batch_size; set them equal.")
        fraction = fraction if fraction is not None else (plan_fraction if plan_fraction is not None else
                                                          DEFAULT_KV_CACHE_FRACTION)
        paged = limits.use_paged_context_fmha
        for name in ("enable_kv_cache_reuse", "enable_chunked_context"):
            if getattr(self, name) and not paged:
                raise KitUsageError(f"{name} needs an engine built with use_paged_context_fmha, but "
                                    f"{limits.model_dir}/config.json has it disabled; rebuild with "
                                    f"--use_paged_context_fmha enable or set {name} = false.")
        blocks = -(-limits.max_batch_size * limits.max_seq_len // limits.tokens_per_block)
        kv_tokens = self.max_tokens_in_paged_kv_cache or blocks * limits.tokens_per_block
        if kv_tokens < limits.max_seq_len:
            raise KitUsageError(f"max_tokens_in_paged_kv_cache {kv_tokens} is below max_seq_len "
                                f"{limits.max_seq_len}: one full-length sequence would not fit; raise it.")
        num_cpus = num_cpus or os.cpu_count() or 1
        instances = min(max(MIN_INSTANCES, min(limits.max_batch_size, MAX_DEFAULT_INSTANCES)), num_cpus)
        queue = QUEUE_BATCHES * limits.max_batch_size if self.max_queue_size is None else self.max_queue_size
        return replace(
            self, kv_cache_free_gpu_mem_fraction=float(fraction), max_tokens_in_paged_kv_cache=kv_tokens,
            max_queue_size=queue,
            enable_kv_cache_reuse=paged if self.enable_kv_cache_reuse is None else self.enable_kv_cache_reuse,
            enable_chunked_context=paged if self.enable_chunked_context is None else self.enable_chunked_context,
            preprocessing_instances=self.preprocessing_instances or instances,
            postprocessing_instances=self.postprocessing_instances or instances,
            bls_instances=self.bls_instances or instances)

    def to_dict(self) -> dict[str, Any]:
        """Every field (the resolved KV fraction included), as plain values."""
        return {k: plain(v) for k, v in asdict(self).items()}


# The keys of the [repo] table; the KV fraction comes from the build's kv_cache_fraction.
REPO_FIELDS = tuple(d.name for d in declared(RepoOptions, "repo"))
INSTANCES = SharedFlag("--instances", "repo", ("preprocessing_instances", "postprocessing_instances",
                                               "bls_instances"), int,
                       "Instances of preprocessing, postprocessing and BLS (default: max_batch_size clipped to 5..16, "
                       "and at most the build machine's cores).")
