"""The time budgets of a serving pod: how long it may take to become ready, and to stop.

The startup budget is one number given to the startupProbe and to the server's own deadline (``serve
--ready-timeout``, or the multi-node leader's), so the two never disagree:

    work_s    = max(FLOOR_S, bytes read from the volume / load_gbps + runtime init + KV allocation + CUDA graphs)
    startup_s = worker wait (multi-node leader only) + work_s, rounded up to the probe period

``load_gbps`` is the volume's aggregate read rate, shared by every rank that reads it at once: all ranks of a group
on a claim (one network file system), the ranks of one pod with ``artifact_url`` (each pod unpacks its own copy
into an ``emptyDir``). The fixed terms are each target's ``startup_terms``; docs/deploy-kubernetes.md gives the
source of each number. The leader's wait for its workers is inside its own budget: whatever part of
``worker_wait_s`` the workers leave unused is still there, and at least ``work_s`` remains once they answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.targets import get_target

PROBE_PERIOD_S = 10
BUDGET_ANNOTATION = "trtllm-kit.io/startup-budget-s"  # on pod templates, for deploy check
FLOOR_S = 600  # ten minutes: no LLM server is safely ready sooner on a cold node (image layers, CUDA, NCCL)


@dataclass(frozen=True)
class Budgets:
    """The time budgets of one pod, in seconds: its startup (split into its parts) and its grace period."""

    read_s: int
    fixed_s: int
    wait_s: int
    grace_s: int

    @property
    def work_s(self) -> int:
        """What the server needs once it starts: reading, initialising, allocating, capturing; the floor."""
        return max(FLOOR_S, self.read_s + self.fixed_s)

    @property
    def startup_s(self) -> int:
        """The startupProbe's and the server's deadline (the leader's wait included)."""
        return math.ceil((self.wait_s + self.work_s) / PROBE_PERIOD_S) * PROBE_PERIOD_S

    @property
    def startup_failures(self) -> int:
        return self.startup_s // PROBE_PERIOD_S


def volume_bytes(source: DeploySource, settings: DeploySettings, num_nodes: int) -> int:
    """Bytes read at once from one volume: the group's on a claim, one pod's share from its own ``emptyDir``.

    Arguments:
        source: the artifact; settings: how it is delivered; num_nodes: pods per group.
    """
    if settings.pvc is not None:
        return source.load_bytes
    return math.ceil(source.load_bytes / num_nodes)


def budgets(source: DeploySource, settings: DeploySettings, num_nodes: int = 1) -> Budgets:
    """Startup and termination budgets of ``source`` under ``settings`` on ``num_nodes`` pods per group.

    Arguments:
        source: the artifact (its weight bytes, its target); settings: ``load_gbps``, ``worker_wait_s``, drain
        and exit timeout; num_nodes: pods per group (a leader waits for the others).
    """
    read_s = math.ceil(volume_bytes(source, settings, num_nodes) / (settings.load_gbps * 1e9))
    return Budgets(read_s=read_s, fixed_s=get_target(source.target).startup_terms.total_s,
                   wait_s=settings.worker_wait_s if num_nodes > 1 else 0, grace_s=settings.grace_period_s)
