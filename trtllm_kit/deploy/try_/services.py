"""ClusterIP Services on this machine: one TCP relay per Service port, listening on the Service's address in the
cluster's namespace and passing each connection to a ready pod its selector matches, round-robin (as kube-proxy
does per connection). A connection that finds no ready pod is closed, as a Service without endpoints refuses it."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from trtllm_kit.deploy.try_.netns import entered

Endpoints = Callable[[], list[str]]  # the ready pods' addresses, now


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end in (sink, source):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


class Relay:
    """One Service port: ``address:port`` → a ready endpoint's ``target_port``."""

    def __init__(self, node: Path, address: str, port: int, target_port: int, endpoints: Endpoints) -> None:
        self.node, self.target_port, self.endpoints = node, target_port, endpoints
        self._turn = itertools.count()
        self._closed = threading.Event()
        with entered(node):
            self.listener = socket.create_server((address, port))
        self.listener.settimeout(0.2)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        ready = self.endpoints()
        if not ready:
            client.close()
            return
        target = ready[next(self._turn) % len(ready)]
        try:
            with entered(self.node):
                upstream = socket.create_connection((target, self.target_port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)

    def close(self) -> None:
        self._closed.set()
        self.listener.close()
