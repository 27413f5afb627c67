"""KEDA's HTTP interceptor as ``deploy try`` plays it for a deployment that scales to zero: the Service port the
``HTTPScaledObject`` names is reached through a relay that, finding no ready replica, starts one (the scaler's
0 → 1) and holds the connection until the replica is ready or ``timeouts.conditionWait`` is out, as the add-on's
interceptor does, then passes it on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.deploy.scale_to_zero import condition_wait_s
from trtllm_kit.deploy.try_.services import Endpoints, Relay

Obj = dict[str, Any]


@dataclass(frozen=True)
class ScaleToZero:
    """The directory's ``HTTPScaledObject`` at zero: the Service and port it intercepts, how long it holds."""

    service: str
    port: int
    hold_s: float

    @classmethod
    def find(cls, docs: list[tuple[str, Obj]]) -> ScaleToZero | None:
        """The HTTPScaledObject with ``replicas.min`` 0 among ``docs``, or None.

        Arguments:
            docs: (file, object) pairs of a deploy directory.
        """
        for _, doc in docs:
            spec = doc.get("spec") or {}
            if doc.get("kind") == "HTTPScaledObject" and (spec.get("replicas") or {}).get("min", 0) == 0:
                ref = spec.get("scaleTargetRef") or {}
                return cls(str(ref.get("service")), int(ref.get("port", 0)), float(condition_wait_s(doc) or 0))
        return None


class Interceptor(Relay):
    """A Service port that wakes its workload and holds connections while no endpoint is ready.

    Arguments:
        node, address, port, target_port, endpoints: as ``Relay``; wake: starts the replica (called once);
        hold_s: how long a connection is held at most; failed: whether the replica has failed to start (the
        connection is then let go at once, so that the run reports the pod's cause without waiting out the hold).
    """

    def __init__(self, node: Path, address: str, port: int, target_port: int, endpoints: Endpoints,
                 wake: Callable[[], None], hold_s: float, failed: Callable[[], bool]) -> None:
        self.wake, self.hold_s, self.failed = wake, hold_s, failed
        self._woken = threading.Lock()
        self.woke_at: float | None = None
        self.held_s: list[float] = []  # how long each connection that found no replica waited
        super().__init__(node, address, port, target_port, endpoints)

    def _relay(self, client: Any) -> None:
        if not self.endpoints():
            arrived = time.monotonic()
            with self._woken:
                if self.woke_at is None:
                    self.woke_at = arrived
                    self.wake()
            while not self.endpoints() and time.monotonic() - arrived < self.hold_s and not self.failed() and \
                    not self._closed.is_set():
                time.sleep(0.2)
            self.held_s.append(round(time.monotonic() - arrived, 1))
        super()._relay(client)
