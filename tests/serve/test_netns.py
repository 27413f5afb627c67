"""``server/netns.py``'s ``PrivateNet``: a namespace held by one thread, whose listeners answer inside and are
refused outside, joined from its file, and ended with its processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from trtllm_kit.serve.server.netns import PrivateNet, end_namespace, net_namespace, pids_in


def _can_unshare() -> bool:
    return shutil.which("unshare") is not None and shutil.which("ip") is not None and \
        subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _can_unshare(), reason="this user cannot make a network namespace")


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def test_a_listener_in_the_namespace_is_refused_outside_and_answers_inside() -> None:
    net = PrivateNet.private()
    try:
        assert net.namespace != net_namespace(os.getpid())  # this thread, and the process, stay outside
        server = net.call(socket.create_server, ("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not _answers(port)
        assert net.call(_answers, port)
        inside = net.socket((socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", port)))
        inside.connect(("127.0.0.1", port))  # a socket made inside connects from any thread
        inside.close()
        server.close()
    finally:
        net.close()


def test_a_joined_namespace_is_the_same_and_its_processes_end_with_it() -> None:
    net = PrivateNet.private()
    try:
        child = net.call(subprocess.Popen, ["sleep", "60"])
        assert net_namespace(child.pid) == net.namespace and pids_in(net.namespace) == [child.pid]
        joined = PrivateNet.join(net.path)
        try:
            assert joined.namespace == net.namespace
        finally:
            joined.close()
        assert end_namespace(net.namespace) == []
        assert child.wait(5) == -9
    finally:
        net.close()
