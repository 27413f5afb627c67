"""A model error's Triton status code, carried at the head of its message: ``[INVALID_ARG] the sentence``.

A gRPC stream gives a client a failed request's message but not its code, unless the client asks Triton to end the
stream with the code (``triton_grpc_error``). That mode is not safe on Triton 2.51, the server of the CPU path: when
an error response races the stream's next read, its gRPC frontend finishes the call twice and aborts
(``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``), taking every model down with it. So the kit's models begin every error they
answer with its code in brackets, and the kit's client reads the code back (``split_code``) from a stream that stays
open. An error without the mark (Triton's own, a C++ backend's) has no code.
"""

from __future__ import annotations

CODES = ("CANCELLED", "INVALID_ARG", "NOT_FOUND", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "INTERNAL")


def with_code(message: str, code: str) -> str:
    """``message`` marked with ``code`` (one of ``CODES``), replacing a mark it already has (an inner model's).

    Arguments:
        message: the error's sentence; code: its Triton status code, by ``TritonError``'s name for it.
    """
    assert code in CODES, code
    return f"[{code}] {split_code(message)[1]}"


def split_code(message: str) -> tuple[str | None, str]:
    """The code a marked ``message`` begins with (None: unmarked) and the message without the mark.

    Arguments:
        message: an error's message as the client received it.
    """
    head, found, rest = message.partition("] ")
    code = head[1:] if found and head.startswith("[") else None
    return (code, rest) if code in CODES else (None, message)
