"""The reaper ends the process groups it was told of, and only those: a group whose leader's pid now names a process
that started at another time is another program's (the kernel gave the pid out again), and lives on; a group whose
leader exited is ended with the children it left."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from trtllm_kit.serve.server.reaper import group_alive, reap, start_time


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """A process group of its own: a shell leading it and a child of the shell's."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    yield proc
    reap({proc.pid: None}, "")
    proc.wait(timeout=30)


def test_a_group_whose_leader_started_as_noted_is_ended(group: subprocess.Popen[bytes]) -> None:
    reap({group.pid: start_time(group.pid)}, "")
    assert group.wait(timeout=30) == -9 and not group_alive(group.pid)


def test_a_group_whose_pid_names_a_process_started_at_another_time_lives_on(group: subprocess.Popen[bytes]) -> None:
    started = start_time(group.pid)
    assert started is not None
    reap({group.pid: started - 1}, "")  # as if the pid had been handed out again since
    assert group.poll() is None and group_alive(group.pid)


def test_a_group_whose_leader_exited_is_ended_with_the_child_it_left() -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & read line"], stdin=subprocess.PIPE, start_new_session=True)
    started = start_time(leader.pid)
    assert started is not None and leader.stdin is not None
    leader.stdin.close()  # the shell reads end-of-file and exits; its sleep stays in the group
    leader.wait(timeout=30)
    assert start_time(leader.pid) is None and group_alive(leader.pid)
    reap({leader.pid: started}, "")
    assert not group_alive(leader.pid)


def test_a_process_has_a_start_time_and_none_is_none_for_a_pid_without_a_process() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert isinstance(start_time(proc.pid), int)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert start_time(proc.pid) is None
