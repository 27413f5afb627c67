"""One container of a pod on this machine: its spec made into what ``enter`` needs, its process, its log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trtllm_kit
from trtllm_kit.deploy.try_.image import LocalImage
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
FIELDS = {"metadata.name", "metadata.namespace", "status.podIP"}


@dataclass(frozen=True)
class PodContext:
    """What every container of a pod shares: its name, namespace, address, network namespace, volumes, hosts."""

    name: str
    namespace: str
    address: str
    netns: Path
    volumes: dict[str, Path]
    hosts: str
    injected_env: dict[str, str]
    security: Obj
    directory: Path


def container_env(container: Obj, pod: PodContext, image: LocalImage) -> dict[str, str]:
    """The image's environment, the controller's variables, then the container's ``env``."""
    env = {**image.env, **pod.injected_env}
    fields = {"metadata.name": pod.name, "metadata.namespace": pod.namespace, "status.podIP": pod.address}
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        path = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if path not in FIELDS:
            raise KitUsageError(f"container {container['name']}: env {entry['name']} takes its value from "
                                f"{entry.get('valueFrom')}; deploy try gives values and the fields {sorted(FIELDS)}.")
        env[entry["name"]] = fields[path]
    return env


def enter_spec(container: Obj, pod: PodContext, image: LocalImage, root: Path) -> Obj:
    """The JSON ``enter`` reads for ``container``.

    Arguments:
        container: the container spec; pod: the pod's context; image: the stand-in image; root: the layers' dir.
    """
    security = {**pod.security, **(container.get("securityContext") or {})}
    mounts = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in pod.volumes:
            raise KitUsageError(f"container {container['name']} mounts volume {mount['name']}, which the pod does "
                                "not define.")
        mounts.append({"source": str(pod.volumes[mount["name"]]), "target": mount["mountPath"],
                       "readOnly": bool(mount.get("readOnly"))})
    groups = [g for g in (pod.security.get("fsGroup"), *(pod.security.get("supplementalGroups") or []))
              if g is not None]
    return {"root": str(root), "mounts": mounts, "links": dict(image.links), "traversable": list(image.traversable),
            "files": {"/etc/hosts": pod.hosts, "/etc/hostname": pod.name + "\n"}, "hostname": pod.name,
            "uid": int(security.get("runAsUser", 0)), "gid": int(security.get("runAsGroup", 0)),
            "groups": sorted(set(groups)), "env": container_env(container, pod, image),
            "argv": [*(container.get("command") or []), *(container.get("args") or [])],
            "workdir": container.get("workingDir") or "/"}


class Container:
    """A running container: its process (the command's own pid) and its log."""

    def __init__(self, container: Obj, pod: PodContext, image: LocalImage) -> None:
        self.name = str(container["name"])
        self.spec = container
        self.pod = pod
        directory = pod.directory / "containers" / self.name
        directory.mkdir(parents=True)
        (directory / "layers").mkdir()
        self.log = directory / "log"
        spec = enter_spec(container, pod, image, directory / "layers")
        if not spec["argv"]:
            raise KitUsageError(f"container {self.name} has no command; the kit's image has no entrypoint to run.")
        (directory / "enter.json").write_text(json.dumps(spec))
        root = str(Path(trtllm_kit.__file__).parent.parent)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["nsenter", f"--net={pod.netns}", "--", "unshare", "--mount", "--uts", "--propagation", "private",
                 "--", sys.executable, "-m", "trtllm_kit.deploy.try_.enter", str(directory / "enter.json")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": root})

    def exited(self) -> int | None:
        return self.process.poll()

    def signal(self, number: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(number)

    def tail(self, num_chars: int = 600) -> str:
        """The end of the container's output, on one line."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line for line in text[-num_chars:].splitlines() if line.strip())

    def run_in(self, argv: list[str], timeout_s: float) -> int:
        """Run ``argv`` inside the container (its namespaces, root and user), as an ``exec`` handler would.

        Arguments:
            argv: the command; timeout_s: at most this long.
        """
        security = {**self.pod.security, **(self.spec.get("securityContext") or {})}
        done = subprocess.run(["nsenter", "-t", str(self.process.pid), "-m", "-n", "-u", "-r", "-w",
                               "-S", str(security.get("runAsUser", 0)), "-G", str(security.get("runAsGroup", 0)),
                               "--", *argv], capture_output=True, timeout=timeout_s)
        return done.returncode
