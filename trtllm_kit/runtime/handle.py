"""What the engine loop (``runtime/loop.py``) asks of whoever submitted a request, and how a request fails.

A ``Handle`` is the submitter's side of one request: the loop hands it each step's progress of the request's
sequences (the last one's marked), tells it once why the request ended without finishing (``failed``), and asks
it whether its client has gone (``is_cancelled``). A Triton model's handle wraps a ``pb_utils`` request and its
sender; the CPU ``LLM``'s pushes updates to an asyncio loop. A ``Failure`` says what kind of end it was, so each
transport names it its own way (a Triton error code, an exception class).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Protocol

from trtllm_kit.errors import KitError, KitUsageError

if TYPE_CHECKING:
    from trtllm_kit.runtime.sequence import Sequence


class QueueFullError(KitError):
    """The waiting queue holds ``max_queue_size`` requests; the request was not accepted."""


class Failure(Enum):
    """Why a request ended without finishing."""

    CANCELLED = "cancelled"  # its client left, or a stop request named it
    INVALID = "invalid"  # the request can never run as sent
    UNAVAILABLE = "unavailable"  # the server cannot take it now (queue full, shutting down): send it again later
    INTERNAL = "internal"  # the runtime failed


def failure_of(exc: BaseException) -> Failure:
    """The kind of failure an exception raised for a request is.

    Arguments:
        exc: what submitting or running the request raised.
    """
    if isinstance(exc, QueueFullError):
        return Failure.UNAVAILABLE
    if isinstance(exc, KitUsageError):  # the wire's refusals (WireError) among them
        return Failure.INVALID
    return Failure.INTERNAL


class Handle(Protocol):
    """The submitter's side of one request; the loop calls it on the engine thread only."""

    def progress(self, seq: Sequence, is_last: bool) -> None:
        """One of the request's sequences sampled tokens or finished (``seq.is_finished``); ``is_last``: no other
        sequence of the request is left, so this is the request's end."""

    def failed(self, message: str, kind: Failure) -> None:
        """The request ended without finishing; called once, after which the loop forgets the handle."""

    def is_cancelled(self) -> bool:
        """Whether the request's client has gone (polled by the loop every turn: a handle whose transport makes
        this a round trip may answer from what it last learnt, as the Triton model's does between responses)."""
