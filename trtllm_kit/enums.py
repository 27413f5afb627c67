"""The kit's closed choices, each spelt once: what a flag offers, a TOML key takes and a manifest stores.

Every enum is ``str``-valued: a member compares, hashes, prints and serialises (JSON, TOML) as its plain
string, so ``Dtype.AUTO == "auto"`` and ``json.dumps(Target.CPU) == '"cpu"'``. Adding a choice is one line.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from trtllm_kit.errors import KitUsageError

C = TypeVar("C", bound="Choice")


class Choice(str, Enum):
    """A ``str``-valued enum whose members read as their value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The spellings, in declaration order."""
        return tuple(str(member.value) for member in cls)

    @classmethod
    def parse(cls: type[C], name: str, value: object) -> C:
        """The member spelt ``value``, or a usage error naming the field and the valid spellings.

        Arguments:
            name: the field or flag, for the message; value: a member or its string.
        """
        try:
            return cls(value)
        except ValueError:
            raise KitUsageError(f"{name} {value!r} is not one of {', '.join(cls.values())}.") from None


class Dtype(Choice):
    """The checkpoint dtype; ``auto`` takes the model's (float32 → float16, as TensorRT-LLM does)."""

    AUTO = "auto"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class Server(Choice):
    """What ``serve`` runs: tritonserver over ``repo/``, or an llmapi artifact's recorded ``trtllm-serve``."""

    TRITON = "triton"
    TRTLLM_SERVE = "trtllm-serve"


class Router(Choice):
    """How ``serve --dynamo``'s frontend picks a worker: by cached prefix (KV-aware), in turn, or at random; how
    ``serve --ray`` routes to a replica: to the one that served the prompt's first block, or the less loaded of two
    drawn at random (Ray Serve's default)."""

    KV = "kv"
    ROUND_ROBIN = "round-robin"
    RANDOM = "random"
    PREFIX = "prefix"
    POW2 = "pow2"


class Stage(Choice):
    """The build stages, in the order they run."""

    CHECKPOINT = "checkpoint"
    ENGINE = "engine"
    REPO = "repo"


class Target(Choice):
    """The serving target (``trtllm_kit.targets`` registers one module per member but ``auto``): the kit's CPU
    runtime, engines compiled by trtllm-build, or TensorRT-LLM's PyTorch backend (LLM API)."""

    AUTO = "auto"
    CPU = "cpu"
    ENGINE = "engine"
    LLMAPI = "llmapi"


class Quant(Choice):
    """Weight/activation quantization: none, INT8 weight-only (W8A16), INT8 SmoothQuant, FP8, NVFP4 (llmapi),
    INT4 AWQ (W4A16, llmapi and engine)."""

    NONE = "none"
    INT8_WO = "int8-wo"
    INT8_SQ = "int8-sq"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    INT4_AWQ = "int4-awq"


class CalibDtype(Choice):
    """The dtype calibration computes in: bfloat16 (as ModelOpt) or float32."""

    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class KVCache(Choice):
    """KV-cache precision; ``auto`` keeps the model dtype."""

    AUTO = "auto"
    INT8 = "int8"
    FP8 = "fp8"


class SchedulerPolicy(Choice):
    """``batch_scheduler_policy`` of the ``tensorrt_llm`` model: what the C++ backend accepts (docs/triton-repo.md
    §3.2). The CPU runtime also runs ``STATIC_BATCHING``, a baseline that benchmarks/batching.py compares
    in-flight batching with; the C++ backend has no such policy, so no option offers it and no repository is
    written with it."""

    GUARANTEED_NO_EVICT = "guaranteed_no_evict"
    MAX_UTILIZATION = "max_utilization"


STATIC_BATCHING = "static"
RUNTIME_SCHEDULER_POLICIES = (*SchedulerPolicy.values(), STATIC_BATCHING)


class GroupLaunch(Choice):
    """How a target starts one replica's ranks across the pods of a group (``deploy``)."""

    TRITON_RANKS = "triton-ranks"  # one tritonserver per rank under mpirun; rank 0 serves
    LLMAPI_LAUNCH = "llmapi-launch"  # trtllm-llmapi-launch trtllm-serve on every rank; rank 0 serves OpenAI
