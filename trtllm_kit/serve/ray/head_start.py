"""Starting the private Ray head, once more when Ray's own wait runs out.

Ray gives a new node's raylet a fixed 30 s to register with its GCS (``ray._private.node``, not configurable) and
raises a bare ``Exception`` after it; on a loaded machine the raylet can take longer. The processes the failed start
left (GCS, raylet, their helpers) are ended before the second try, so it starts clean.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psutil

HEAD_START_TRIES = 2
TIMED_OUT = "timed out during startup"  # the words of Ray's node start-up timeout
END_WAIT_S = 10.0

log = logging.getLogger(__name__)


def start_head(init: Callable[[], object], shutdown: Callable[[], object]) -> None:
    """Run ``init``; when Ray's start-up wait runs out, end what it left and run it once more.

    Arguments:
        init: starts the head (``ray.init`` with its arguments); shutdown: ``ray.shutdown``.
    """
    for attempt in range(1, HEAD_START_TRIES + 1):
        try:
            init()
            return
        except Exception as exc:  # Ray raises a bare Exception for this one
            if TIMED_OUT not in str(exc) or attempt == HEAD_START_TRIES:
                raise
            log.warning("Ray's head did not start in Ray's 30 s (a loaded machine); its processes are ended and it "
                        "starts once more")
            shutdown()
            end_children()


def end_children() -> None:
    """SIGKILL every process this one started, and reap them."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(children, timeout=END_WAIT_S)
