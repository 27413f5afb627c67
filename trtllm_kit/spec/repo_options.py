"""The ``[repo]`` table: the repository settings a user chooses (each declared once; ``build`` flags are generated
from the declarations), validated. ``model_repo.options.resolve_options`` fills them in against the engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from trtllm_kit.defaults import DEFAULT_LORA_CACHE_GPU_MEMORY_FRACTION, DEFAULT_LORA_CACHE_HOST_MEMORY_BYTES
from trtllm_kit.enums import SchedulerPolicy
from trtllm_kit.errors import KitUsageError
from trtllm_kit.option import SharedFlag, check_declared, declared, option, plain
from trtllm_kit.spec.gpu_groups import parse_gpu_device_ids

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
    lora_cache_host_memory_bytes: int = field(default=DEFAULT_LORA_CACHE_HOST_MEMORY_BYTES, metadata=option(
        "Host memory of the LoRA adapter cache (the backend's lora_cache_host_memory_bytes; the CPU runtime holds as "
        "many adapters of max_lora_rank on every module as fit); the least recently used adapter is evicted.",
        "--lora-cache-host-memory-bytes", minimum=1))
    lora_cache_gpu_memory_fraction: float = field(default=DEFAULT_LORA_CACHE_GPU_MEMORY_FRACTION, metadata=option(
        "GPU memory of the LoRA cache, as a fraction of what is left after the engine and the KV cache (engine "
        "target).", "--lora-cache-gpu-memory-fraction"))
    gpu_device_ids: str | None = field(default=None, metadata=option(
        "llmapi target: run one tensorrt_llm instance (its own LLM) per ';'-separated group of tp x pp GPU ids, "
        "e.g. 0,1;2,3 (default: one instance on the visible GPUs).", "--gpu-device-ids", metavar="IDS"))

    def __post_init__(self) -> None:
        check_declared(self, "repo")
        if self.gpu_device_ids is not None:
            parse_gpu_device_ids(self.gpu_device_ids)  # refuses a malformed list before any work
        fraction = self.kv_cache_free_gpu_mem_fraction
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, int | float)
                                     or not 0 < fraction <= 1):
            raise KitUsageError(f"kv_cache_free_gpu_mem_fraction must be in (0, 1], got {fraction!r}.")
        if not 0 < self.lora_cache_gpu_memory_fraction <= 1:
            raise KitUsageError(f"lora_cache_gpu_memory_fraction must be in (0, 1], got "
                                f"{self.lora_cache_gpu_memory_fraction!r}.")

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> RepoOptions:
        """The options among ``values``; ``None`` values take the defaults.

        Arguments:
            values: any mapping, e.g. ``BuildSpec.to_dict()["repo"]``.
        """
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def to_dict(self) -> dict[str, Any]:
        """Every field (the resolved KV fraction included), as plain values."""
        return {k: plain(v) for k, v in asdict(self).items()}


# The keys of the [repo] table; the KV fraction comes from the build's kv_cache_fraction.
REPO_FIELDS = tuple(d.name for d in declared(RepoOptions, "repo"))
INSTANCES = SharedFlag("--instances", "repo", ("preprocessing_instances", "postprocessing_instances",
                                               "bls_instances"), int,
                       "Instances of preprocessing, postprocessing and BLS (default: max_batch_size clipped to 5..16, "
                       "and at most the build machine's cores).")
