"""Network namespaces for ``deploy try``: one for the cluster (the node's side: a bridge every pod hangs on, the
Services' addresses, where probes and clients come from) and one per pod. Nothing is added to this machine's own
network namespace.

A namespace lives as long as a ``sleep`` process started in it (the pause container's role). A thread enters one
with ``setns(2)``, which moves the calling thread only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from trtllm_kit.errors import KitError

CLONE_NEWNET = 0x40000000
POD_CIDR = ipaddress.ip_network("10.244.0.0/16")
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/16")
BRIDGE = "cbr0"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def entered(namespace: Path) -> Iterator[None]:
    """The calling thread inside the network namespace at ``namespace`` (``/proc/PID/ns/net``), then back.

    Arguments:
        namespace: the namespace file.
    """
    libc = _libc()
    own = os.open(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(namespace, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise KitError(f"cannot enter the network namespace {namespace}: {os.strerror(ctypes.get_errno())}")
        yield
    finally:
        libc.setns(own, CLONE_NEWNET)
        os.close(target)
        os.close(own)


class NetNamespace:
    """A network namespace held by a ``sleep`` process of its own."""

    def __init__(self) -> None:
        unshare = shutil.which("unshare")
        if unshare is None or os.geteuid() != 0:
            raise KitError("deploy try runs pods in namespaces of their own, which needs root and util-linux's "
                           "unshare; run it as root on a Linux machine.")
        self.holder = subprocess.Popen([unshare, "--net", "--", "sleep", "infinity"], start_new_session=True)
        self.path = Path(f"/proc/{self.holder.pid}/ns/net")
        own = os.readlink(f"/proc/{os.getpid()}/ns/net")
        deadline = time.monotonic() + 30
        while os.readlink(self.path) == own:  # until unshare has left this machine's namespace
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise KitError(f"unshare --net did not make a network namespace (exit {self.holder.poll()}).")
            time.sleep(0.01)

    def ip(self, *args: str) -> None:
        """Run ``ip ARGS`` inside the namespace; its failure is raised with ip's message."""
        run_checked(["nsenter", f"--net={self.path}", "--", "ip", *args])

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


def run_checked(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise KitError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-300:]}")


class ClusterNetwork:
    """The cluster's namespace with a bridge; pods get an address on it, Services one on its loopback."""

    def __init__(self) -> None:
        self.node = NetNamespace()
        self.gateway = POD_CIDR.network_address + 1
        self._pods = POD_CIDR.hosts()
        next(self._pods)  # the gateway's
        self._services = SERVICE_CIDR.hosts()
        self.node.ip("link", "set", "lo", "up")
        self.node.ip("link", "add", BRIDGE, "type", "bridge")
        self.node.ip("addr", "add", f"{self.gateway}/{POD_CIDR.prefixlen}", "dev", BRIDGE)
        self.node.ip("link", "set", BRIDGE, "up")

    def add_pod(self, pod: NetNamespace, index: int) -> str:
        """Connect a pod's namespace to the bridge (its ``eth0``) and return its address.

        Arguments:
            pod: the pod's namespace; index: a number unique among the pods (names the host side of the link).
        """
        address = str(next(self._pods))
        host_side = f"veth{index}"
        run_checked(["ip", "link", "add", host_side, "netns", str(self.node.holder.pid), "type", "veth", "peer",
                     "name", "eth0", "netns", str(pod.holder.pid)])
        self.node.ip("link", "set", host_side, "master", BRIDGE, "up")
        pod.ip("link", "set", "lo", "up")
        pod.ip("addr", "add", f"{address}/{POD_CIDR.prefixlen}", "dev", "eth0")
        pod.ip("link", "set", "eth0", "up")
        pod.ip("route", "add", "default", "via", str(self.gateway))
        return address

    def add_service_address(self) -> str:
        """A fresh Service address, answered in the cluster's namespace (the proxies listen on it)."""
        address = str(next(self._services))
        self.node.ip("addr", "add", f"{address}/32", "dev", "lo")
        return address

    def close(self) -> None:
        self.node.close()
