"""The multi-node leader's plan, written by ``deploy k8s`` as JSON into the launch ConfigMap and read by
``trtllm-kit deploy leader`` in the pod (``deploy/leader.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError

TOKEN_SLOT = "@TRITON_TOKEN@"  # in the plan's rank commands; the leader puts the token it draws there


@dataclass(frozen=True)
class FrontendPlan:
    """The kit's OpenAI frontend on the leader: the served name, the Triton text model, the key file."""

    out: str
    served_name: str
    text_model: str
    port: int
    host: str = "0.0.0.0"  # every interface of the pod
    grpc_url: str = "127.0.0.1:8001"
    api_keys: str | None = None
    usage_log: str | None = None


@dataclass(frozen=True)
class LeaderPlan:
    """What ``deploy k8s`` decided for the leader (written as JSON into the launch ConfigMap)."""

    num_workers: int
    slots: int  # ranks per pod
    ranks: tuple[str, ...]  # mpirun's rank part: "-n 1 CMD : -n 1 CMD" or "-n N CMD"
    ready_url: str
    worker_wait_s: int
    startup_s: int
    exit_timeout_s: int
    ssh_port: int
    ssh_key: str
    forward_env: tuple[str, ...] = ()
    frontend: FrontendPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(ranks=list(self.ranks), forward_env=list(self.forward_env),
                      frontend=None if self.frontend is None else vars(self.frontend))
        return values

    @classmethod
    def read(cls, path: Path) -> LeaderPlan:
        """The plan in ``path`` (JSON).

        Arguments:
            path: the launch ConfigMap's ``plan.json``.
        """
        try:
            values = json.loads(path.read_text())
            frontend = values.pop("frontend", None)
            return cls(**{**values, "ranks": tuple(values["ranks"]), "forward_env": tuple(values["forward_env"])},
                       frontend=FrontendPlan(**frontend) if frontend else None)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise KitUsageError(f"the leader plan {path} cannot be read ({exc}); write it with trtllm-kit deploy "
                                "k8s.") from None
