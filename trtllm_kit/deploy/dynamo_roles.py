"""The TensorRT-LLM workers of a Dynamo graph: their roles, GPUs, ``dynamo.trtllm`` argv and engine options.

Aggregated: one ``worker`` role serving both phases. Disaggregated: a ``prefill`` and a ``decode`` role, each
with its own replicas and TP; both carry the cache transceiver (same backend, same KV dtype), the overlap
scheduler is off on prefill (TensorRT-LLM does not support it on context-only servers). The engine options are
the artifact's ``extra_llm_api_options.yaml`` with these keys set, checked against the ``TorchLlmArgs`` table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.llm_args import check_llm_args

WORKER_MODULE = ("python3", "-m", "dynamo.trtllm")
PUBLISH_KV_EVENTS = "--publish-kv-events"  # for the frontend's KV router (upstream's --publish-events-and-metrics)
OPTIONS_DIR = "/etc/trtllm-kit/engine"  # the engine-options ConfigMap's mount
TRANSCEIVER_BACKEND = "UCX"  # set explicitly: DEFAULT resolves differently across versions
DEFAULT_TRANSFER_TOKENS = 8192  # max_tokens_in_buffer when the options name no max_seq_len (>= the longest input)
KV_FRACTION = {"worker": 0.9, "prefill": 0.75, "decode": 0.85}  # free_gpu_memory_fraction per role


@dataclass(frozen=True)
class Role:
    """One worker component: its name and type in the graph, ``--disaggregation-mode``, replicas and TP."""

    name: str
    type: str  # worker | prefill | decode
    replicas: int
    tp_size: int
    pp_size: int = 1

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def mode(self) -> str | None:
        """``--disaggregation-mode``; None for the aggregated worker (upstream's agg example passes none)."""
        return None if self.type == "worker" else self.type

    @property
    def options_file(self) -> str:
        return f"{self.name}.yaml"

    def num_nodes(self, gpus_per_node: int) -> int:
        """Pods per replica: one, or ``world / gpus_per_node`` when the ranks outgrow a node (whole nodes only)."""
        if self.world_size <= gpus_per_node:
            return 1
        if self.world_size % gpus_per_node:
            raise KitUsageError(f"the {self.name} role has {self.world_size} ranks, which do not fill whole nodes of "
                                f"{gpus_per_node} GPUs; pick a TP that is a multiple of --gpus-per-node.")
        return self.world_size // gpus_per_node

    def gpus_per_pod(self, gpus_per_node: int) -> int:
        return math.ceil(self.world_size / self.num_nodes(gpus_per_node))


def roles_for(source: DeploySource, *, disagg: bool, replicas: int, prefill_replicas: int, decode_replicas: int,
              prefill_tp: int | None, decode_tp: int | None) -> tuple[Role, ...]:
    """The worker roles: one aggregated worker at the artifact's layout, or prefill and decode.

    Arguments:
        source: the artifact (llmapi); disagg: split the phases; replicas: aggregated workers; prefill_replicas,
        decode_replicas: workers per role; prefill_tp, decode_tp: TP per role (default the artifact's).
    """
    if source.target != "llmapi":
        raise KitUsageError(f"deploy dynamo runs llmapi artifacts on Dynamo's TensorRT-LLM workers; this one's "
                            f"target is {source.target}; rebuild with --target llmapi.")
    if not disagg and (prefill_tp or decode_tp):
        raise KitUsageError("--prefill-tp and --decode-tp apply to --disagg only; add --disagg or drop them.")
    for flag, number in (("--replicas", replicas), ("--prefill-replicas", prefill_replicas),
                         ("--decode-replicas", decode_replicas), ("--prefill-tp", prefill_tp or 1),
                         ("--decode-tp", decode_tp or 1)):
        if number < 1:
            raise KitUsageError(f"{flag} must be at least 1, got {number}.")
    if not disagg:
        return (Role("TRTLLMWorker", "worker", replicas, source.tp_size, source.pp_size),)
    return (Role("prefill", "prefill", prefill_replicas, prefill_tp or source.tp_size, source.pp_size),
            Role("decode", "decode", decode_replicas, decode_tp or source.tp_size, source.pp_size))


def engine_options(source: DeploySource, role: Role) -> dict[str, Any]:
    """The role's ``--extra-engine-args`` YAML as a mapping, checked against the ``TorchLlmArgs`` field table.

    Arguments:
        source: the artifact (its recorded options are the base); role: the worker role.
    """
    base = yaml.safe_load(source.serve_options or "") or {}
    kv_cache = {**(base.get("kv_cache_config") or {}), "free_gpu_memory_fraction": KV_FRACTION[role.type]}
    options = {**base, "tensor_parallel_size": role.tp_size, "pipeline_parallel_size": role.pp_size,
               "kv_cache_config": kv_cache}
    if role.mode is not None:
        kv_cache.setdefault("dtype", "auto")  # the same on both roles: the transferred blocks must match
        options["disable_overlap_scheduler"] = role.type == "prefill"
        options["cache_transceiver_config"] = {
            "backend": TRANSCEIVER_BACKEND,
            "max_tokens_in_buffer": int(base.get("max_seq_len") or DEFAULT_TRANSFER_TOKENS)}
    check_llm_args(options)
    return options


def worker_args(source: DeploySource, role: Role, model_path: str) -> list[str]:
    """``dynamo.trtllm``'s arguments for the role: the model, its served name, the engine options, the mode, and
    the KV events the frontend's router reads (aggregated and prefill workers).

    Arguments:
        source: the artifact (its model name); role: the worker role; model_path: the checkpoint in the pod.
    """
    args = ["--model", model_path, "--served-model-name", source.model,
            "--extra-engine-args", f"{OPTIONS_DIR}/{role.options_file}"]
    publishes = role.type != "decode"  # the router picks the worker a prompt's prefill runs on (upstream's rule)
    return args + (["--disaggregation-mode", role.mode] if role.mode else []) + ([PUBLISH_KV_EVENTS] if publishes
                                                                                 else [])
