"""The repository settings a user chooses (the ``[repo]`` table and ``build`` flags), validated, and their
resolution against the engine's limits."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.limits import EngineLimits

SCHEDULER_POLICIES = ("guaranteed_no_evict", "max_utilization")
MIN_INSTANCES = 5  # the backend docs advise about 5 pre/post/BLS instances, or the batch size; never 1 by default
MAX_DEFAULT_INSTANCES = 16
DEFAULT_KV_FRACTION = 0.9  # the backend's default


@dataclass(frozen=True)
class RepoOptions:
    """Settings of the generated repository; ``None`` means "derive from the engine and the plan"."""

    decoupled: bool = True
    kv_cache_free_gpu_mem_fraction: float | None = None
    max_tokens_in_paged_kv_cache: int | None = None
    enable_kv_cache_reuse: bool | None = None
    enable_chunked_context: bool | None = None
    batch_scheduler_policy: str = "guaranteed_no_evict"
    max_queue_size: int = 0
    max_queue_delay_microseconds: int = 0
    exclude_input_in_output: bool = True
    preprocessing_instances: int | None = None
    postprocessing_instances: int | None = None
    bls_instances: int | None = None

    def __post_init__(self) -> None:
        fraction = self.kv_cache_free_gpu_mem_fraction
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, int | float)
                                     or not 0 < fraction <= 1):
            raise KitUsageError(f"kv_cache_free_gpu_mem_fraction must be in (0, 1], got {fraction!r}.")
        if self.batch_scheduler_policy not in SCHEDULER_POLICIES:
            raise KitUsageError(f"batch_scheduler_policy {self.batch_scheduler_policy!r} is not one of "
                                f"{', '.join(SCHEDULER_POLICIES)}.")
        for name in ("decoupled", "exclude_input_in_output", "enable_kv_cache_reuse", "enable_chunked_context"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise KitUsageError(f"{name} must be true or false, got {value!r}.")
        for name, low in (("max_tokens_in_paged_kv_cache", 1), ("max_queue_size", 0),
                          ("max_queue_delay_microseconds", 0), ("preprocessing_instances", 1),
                          ("postprocessing_instances", 1), ("bls_instances", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise KitUsageError(f"{name} must be an integer >= {low}, got {value!r}.")

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> RepoOptions:
        """The options among ``values`` (a spec's fields); ``None`` values take the defaults.

        Arguments:
            values: any mapping, e.g. ``BuildSpec.to_dict()``.
        """
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def resolve(self, limits: EngineLimits, plan_fraction: float | None = None) -> RepoOptions:
        """Fill every ``None`` from the engine and the plan, and check the explicit values against them.

        Arguments:
            limits: what the engine (or the CPU runtime) was built for;
            plan_fraction: the KV-cache memory fraction the build plan sized ``max_batch_size`` with, if any.
        """
        fraction = self.kv_cache_free_gpu_mem_fraction
        if fraction is not None and plan_fraction is not None and float(fraction) != float(plan_fraction):
            raise KitUsageError(f"kv_cache_free_gpu_mem_fraction {fraction} differs from the build plan's "
                                f"kv_cache_fraction {plan_fraction}, which sized max_batch_size; set them equal.")
        fraction = fraction if fraction is not None else (plan_fraction if plan_fraction is not None else
                                                          DEFAULT_KV_FRACTION)
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
        instances = max(MIN_INSTANCES, min(limits.max_batch_size, MAX_DEFAULT_INSTANCES))
        return replace(
            self, kv_cache_free_gpu_mem_fraction=float(fraction), max_tokens_in_paged_kv_cache=kv_tokens,
            enable_kv_cache_reuse=paged if self.enable_kv_cache_reuse is None else self.enable_kv_cache_reuse,
            enable_chunked_context=paged if self.enable_chunked_context is None else self.enable_chunked_context,
            preprocessing_instances=self.preprocessing_instances or instances,
            postprocessing_instances=self.postprocessing_instances or instances,
            bls_instances=self.bls_instances or instances)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The options a build spec carries (the [repo] table); the KV fraction comes from the spec's kv_cache_fraction.
REPO_FIELDS = tuple(f.name for f in fields(RepoOptions) if f.name != "kv_cache_free_gpu_mem_fraction")
