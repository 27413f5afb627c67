"""NVTX ranges around the benchmark's phases, so an Nsight Systems capture can be cut to the measured window."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

NVTX_DOMAIN = "trtllm-kit"


@contextmanager
def nvtx_range(message: str) -> Iterator[None]:
    """An NVTX range in the ``trtllm-kit`` domain when the ``nvtx`` package is installed, else nothing.

    Arguments:
        message: e.g. ``warmup`` or ``measure/concurrency/4``.
    """
    try:
        import nvtx
    except ImportError:
        yield
        return
    with nvtx.annotate(message, domain=NVTX_DOMAIN):
        yield
