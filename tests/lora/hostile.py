"""Adapter directories made to hurt a loader, from a good PEFT adapter: FIFOs, links to ``/dev/zero`` and out of
the directory, oversized files and headers, NaN weights, broken hyperparameters, another base model's name; and
``within``, which runs a load with a time bound so that a loader that blocks fails the test instead of hanging it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from safetensors.torch import load_file, save_file

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
T = TypeVar("T")


def copy_adapter(good: Path, into: Path) -> Path:
    into.mkdir(parents=True)
    for name in (CONFIG, WEIGHTS):
        shutil.copyfile(good / name, into / name)
    return into


def with_fifo(good: Path, into: Path, name: str) -> Path:
    """``name`` replaced by a FIFO no one writes to."""
    copy_adapter(good, into)
    (into / name).unlink()
    os.mkfifo(into / name)
    return into


def with_link(good: Path, into: Path, name: str, target: Path) -> Path:
    """``name`` replaced by a link to ``target``."""
    copy_adapter(good, into)
    (into / name).unlink()
    (into / name).symlink_to(target)
    return into


def with_outside_link(good: Path, into: Path, name: str) -> Path:
    """``name`` a link to a copy of the good file in a directory beside the adapter (a valid file, but outside)."""
    outside = into.with_name(into.name + "-outside")
    outside.mkdir(parents=True)
    shutil.copyfile(good / name, outside / name)
    return with_link(good, into, name, outside / name)


def with_config(good: Path, into: Path, **changes: object) -> Path:
    copy_adapter(good, into)
    config = json.loads((good / CONFIG).read_text())
    (into / CONFIG).write_text(json.dumps({**config, **changes}))
    return into


def with_padded_config(good: Path, into: Path, size: int) -> Path:
    """A valid config padded with spaces to ``size`` bytes."""
    copy_adapter(good, into)
    text = (good / CONFIG).read_text()
    (into / CONFIG).write_text(text + " " * (size - len(text)))
    return into


def with_nested_config(good: Path, into: Path, depth: int) -> Path:
    copy_adapter(good, into)
    (into / CONFIG).write_text("[" * depth + "]" * depth)
    return into


def with_weights(good: Path, into: Path, change: Callable[[dict], dict]) -> Path:
    copy_adapter(good, into)
    save_file(change(load_file(good / WEIGHTS)), into / WEIGHTS)
    return into


def with_nan(good: Path, into: Path, value: float = math.nan) -> Path:
    """One lora_B holds ``value`` (NaN or infinity)."""
    def poison(tensors: dict) -> dict:
        name = next(n for n in sorted(tensors) if "lora_B" in n)
        tensors[name] = tensors[name].clone()
        tensors[name][0, 0] = value
        return tensors
    return with_weights(good, into, poison)


def with_many_tensors(good: Path, into: Path, count: int) -> Path:
    """A safetensors file whose header declares ``count`` empty tensors (a few MB of JSON)."""
    copy_adapter(good, into)
    header = json.dumps({f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(count)})
    raw = header.encode()
    (into / WEIGHTS).write_bytes(struct.pack("<Q", len(raw)) + raw)
    return into


def with_header_length(good: Path, into: Path, claimed: int) -> Path:
    """A safetensors file whose first 8 bytes claim a header of ``claimed`` bytes."""
    copy_adapter(good, into)
    (into / WEIGHTS).write_bytes(struct.pack("<Q", claimed) + b"{}")
    return into


def with_sparse_tail(good: Path, into: Path, size: int) -> Path:
    """The good weights followed by zeros to ``size`` bytes (a sparse file: nothing is written)."""
    copy_adapter(good, into)
    os.truncate(into / WEIGHTS, size)
    return into


def release_fifos(root: Path) -> None:
    """Open every FIFO under ``root`` for writing and close it, so a reader blocked on it sees its end."""
    for path in root.rglob("*"):
        if path.is_fifo():
            with contextlib.suppress(OSError):  # no reader is waiting
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def within(seconds: float, call: Callable[[], T]) -> T:
    """``call()``, failing the test when it has not returned after ``seconds`` (it runs in a daemon thread)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the load had not returned after {seconds:g} s: it blocks")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
