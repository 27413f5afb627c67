"""The engine's heartbeat file: written by the stub's loop when the number of held requests changes or a beat is
due, silent without a directory, read back as (requests held, seconds since the last beat)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtllm_kit.runtime.heartbeat import HEARTBEAT_ENV, Heartbeat, silent_for


def test_a_beat_records_the_requests_held_and_a_change_is_written_at_once(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HEARTBEAT_ENV, str(tmp_path))
    heartbeat = Heartbeat()
    assert silent_for(tmp_path, os.getpid()) is None  # never beat
    heartbeat.beat(2)
    held, age_s = silent_for(tmp_path, os.getpid()) or (None, None)
    assert held == 2 and age_s is not None and age_s < 60
    old = os.stat(tmp_path / str(os.getpid())).st_mtime - 100
    os.utime(tmp_path / str(os.getpid()), (old, old))
    heartbeat.beat(2)  # the same count within BEAT_EVERY_S: not rewritten
    assert (silent_for(tmp_path, os.getpid()) or (0, 0.0))[1] >= 100
    heartbeat.beat(0)  # a change is written at once
    held, age_s = silent_for(tmp_path, os.getpid()) or (None, None)
    assert held == 0 and age_s is not None and age_s < 60
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(os.getpid())]  # no staged file left


def test_without_a_directory_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HEARTBEAT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    Heartbeat().beat(3)
    assert list(tmp_path.iterdir()) == []
