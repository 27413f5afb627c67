"""A file system that has no room: the errors that mean it, the exception that says it, and sizes as people read
them. Builds (``build/staging.py``) and archives (``artifact/archive.py``) both end with ``DiskFullError``."""

from __future__ import annotations

import errno

from trtllm_kit.errors import KitError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(KitError):
    """The file system being written has no room for what is written."""


def human_size(num_bytes: float) -> str:
    """``num_bytes`` in decimal units with one decimal (``512 B``, ``1.5 MB``).

    Arguments:
        num_bytes: a size.
    """
    for unit in ("B", "KB", "MB", "GB"):
        if abs(num_bytes) < 1000 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    raise AssertionError("unreachable")
