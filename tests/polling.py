"""Waiting on a condition in a test: checked every ``poll_s`` until it holds or ``timeout_s`` (a hang guard) ends."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float, poll_s: float) -> bool:
    """Whether ``predicate()`` was true within ``timeout_s``.

    Arguments:
        predicate: the condition; timeout_s: how long to wait; poll_s: the pause between checks.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False
