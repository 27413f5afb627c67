"""A pod's life as the kubelet leads it: init containers one after another (native sidecars started and left
running), then the containers, each watched by its probes; then the stop: preStop, SIGTERM, the grace period,
SIGKILL, sidecars last. Anything that would make the kubelet restart a container is the pod's ``problem``."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.deploy.try_.containers import Container, PodContext
from trtllm_kit.deploy.try_.image import LocalImage
from trtllm_kit.deploy.try_.netns import entered
from trtllm_kit.deploy.try_.probes import Probe, probes_of

Obj = dict[str, Any]


@dataclass
class ProbeRecord:
    """What one probe saw: when it first passed (seconds after the container started), failures, the last answer."""

    container: str
    description: str
    passed_after_s: float | None = None
    failures: int = 0
    last: str = ""


@dataclass
class StopRecord:
    container: str
    exit_code: int | None
    stopped_after_s: float
    killed: bool


@dataclass
class PodRun:
    """One pod being run."""

    context: PodContext
    spec: Obj
    image: LocalImage
    node: Path  # the cluster's network namespace, where probes come from
    containers: list[Container] = field(default_factory=list)
    sidecars: list[Container] = field(default_factory=list)
    probes: list[ProbeRecord] = field(default_factory=list)
    problem: str | None = None
    _ready: dict[str, bool] = field(default_factory=dict)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.context.name

    def start(self, deadline: float) -> None:
        """Run the init containers in order, then start the containers and their probes.

        Arguments:
            deadline: ``time.monotonic()`` past which an init container that has not ended is a failure.
        """
        for spec in self.spec.get("initContainers") or []:
            container = Container(spec, self.context, self.image)
            if spec.get("restartPolicy") == "Always":
                self.sidecars.append(container)
                continue
            while container.exited() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            code = container.exited()
            if code != 0:
                container.signal(signal.SIGKILL)
                what = "did not end in time" if code is None else f"exited with code {code}"
                self.problem = f"init container {container.name} {what}: {container.tail()}"
                return
        for spec in self.spec.get("containers") or []:
            container = Container(spec, self.context, self.image)
            self.containers.append(container)
            self._ready[container.name] = False
            thread = threading.Thread(target=self._watch, args=(container, probes_of(spec)), daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def is_ready(self) -> bool:
        return bool(self._ready) and all(self._ready.values()) and self.problem is None

    def ready_now(self) -> bool:
        """Whether the pod is ready at this moment: one readiness check now, from the cluster's namespace, of each
        container its probes have not found ready yet (another pod's failure can come between two periods). A pod
        with a problem, or a container still behind its startup probe, is not."""
        if self.problem is not None or not self._ready:
            return False
        with entered(self.node):
            for container in self.containers:
                probes = probes_of(container.spec)
                if self._ready.get(container.name):
                    continue
                probe = probes.get("readinessProbe")
                if probe is None or "startupProbe" in probes or not probe.check(self.context.address)[0]:
                    return False
        return True

    def _fail(self, text: str) -> None:
        if self.problem is None and not self._stopping.is_set():
            self.problem = text

    def _watch(self, container: Container, probes: dict[str, Probe]) -> None:
        """Probe ``container`` until the pod stops, from the cluster's namespace."""
        records = {kind: ProbeRecord(container.name, probe.describe()) for kind, probe in probes.items()}
        self.probes += records.values()
        started = time.monotonic()
        startup = probes.get("startupProbe")
        pending = [k for k in ("readinessProbe", "livenessProbe") if k in probes]
        due = {kind: started + probes[kind].initial_delay_s for kind in probes}
        consecutive = dict.fromkeys(probes, 0)
        passed_startup = startup is None
        if not passed_startup or "readinessProbe" not in probes:
            self._ready[container.name] = passed_startup
        with entered(self.node):
            while not self._stopping.wait(0.1):
                code = container.exited()
                if code is not None:
                    self._fail(f"container {container.name} exited with code {code}: {container.tail()}")
                    return
                kinds = ["startupProbe"] if not passed_startup else pending
                for kind in (k for k in kinds if time.monotonic() >= due[k]):
                    probe, record = probes[kind], records[kind]
                    ok, seen = probe.check(self.context.address)
                    due[kind] = time.monotonic() + probe.period_s
                    record.last = seen
                    if ok and record.passed_after_s is None:
                        record.passed_after_s = round(time.monotonic() - started, 1)
                    consecutive[kind] = 0 if ok else consecutive[kind] + 1
                    record.failures += 0 if ok else 1
                    if kind == "startupProbe" and ok:
                        passed_startup = True
                        due.update({k: time.monotonic() + probes[k].initial_delay_s for k in pending})
                        if "readinessProbe" not in probes:
                            self._ready[container.name] = True
                    elif kind == "readinessProbe":
                        self._ready[container.name] = ok or (self._ready[container.name]
                                                             and consecutive[kind] < probe.failure_threshold)
                    if not ok and kind != "readinessProbe" and consecutive[kind] >= probe.failure_threshold:
                        self._fail(f"container {container.name}: {probe.describe()} failed {consecutive[kind]} "
                                   f"times in a row (last: {seen}), so the kubelet would restart it; "
                                   f"{container.tail()}")
                        return

    def stop(self, grace_s: float) -> list[StopRecord]:
        """Stop as the kubelet does: preStop handlers, SIGTERM, wait out the grace period, SIGKILL; sidecars after.

        Arguments:
            grace_s: ``terminationGracePeriodSeconds``.
        """
        self._stopping.set()
        started = time.monotonic()
        hooks = [threading.Thread(target=self._pre_stop, args=(c,), daemon=True) for c in self.containers]
        for hook in hooks:
            hook.start()
        for hook in hooks:
            hook.join(max(0.0, grace_s - (time.monotonic() - started)))
        records = [self._terminate(c, started + grace_s, started) for c in self.containers]
        records += [self._terminate(c, time.monotonic() + 2, started) for c in self.sidecars]
        return records

    def _pre_stop(self, container: Container) -> None:
        handler = ((container.spec.get("lifecycle") or {}).get("preStop")) or {}
        if container.exited() is not None:
            return
        if "sleep" in handler:
            time.sleep(float(handler["sleep"].get("seconds", 0)))
        elif "exec" in handler:
            container.run_in([str(a) for a in handler["exec"]["command"]], timeout_s=300)

    @staticmethod
    def _terminate(container: Container, deadline: float, started: float) -> StopRecord:
        container.signal(signal.SIGTERM)
        while container.exited() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = container.exited() is None
        if killed:
            container.signal(signal.SIGKILL)
            container.process.wait(timeout=30)
        return StopRecord(container.name, container.exited(), round(time.monotonic() - started, 1), killed)
