"""What values a generation request may carry: one ``Rule`` per field, and the error a refused value becomes.

A rule is a kind (``int``, ``float``, ``bool``, ``str``) and, for numbers, the bounds an engine accepts. Integer
bounds default to the field's tensor type (an ``INT32`` input cannot carry 2**31), so every accepted value can be
sent. Floats must be finite. A refusal is one sentence: the field, what it must be, the value found, what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import KitUsageError

INT_RANGES = {"INT32": (-(2**31), 2**31 - 1), "INT64": (-(2**63), 2**63 - 1), "UINT64": (0, 2**64 - 1)}
POWERS = {2**31 - 1: "2**31 - 1", -(2**31): "-2**31", 2**63 - 1: "2**63 - 1", -(2**63): "-2**63",
          2**64 - 1: "2**64 - 1"}


class WireError(KitUsageError):
    """A request value the wire refuses, said in one sentence that names the field (or the tensor it came in).

    Arguments:
        field: the record field or tensor; message: the sentence; allowed, value, hint: for a range refusal, what
        the field must be, the value found and what to do (so the sentence can be said again under another name).
    """

    def __init__(self, field: str, message: str, *, allowed: str | None = None, value: Any = None,
                 hint: str | None = None) -> None:
        super().__init__(message)
        self.field, self.allowed, self.value, self.hint = field, allowed, value, hint

    def named(self, name: str) -> WireError:
        """The same refusal naming ``name`` (the tensor the value came in) in place of the record field.

        Arguments:
            name: the tensor's name.
        """
        if self.allowed is None:
            return WireError(name, str(self).replace(self.field, name, 1))
        return refusal(name, self.allowed, self.value, self.hint)


def refusal(name: str, allowed: str, value: Any, hint: str | None = None) -> WireError:
    """The refusal of a value out of its range.

    Arguments:
        name: the field or tensor; allowed: what it must be ("a number in [0, 1]"); value: the value found;
        hint: what to do (default: send one that is, or leave the field out).
    """
    todo = hint if hint is not None else f"send one that is, or leave {name} out"
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return WireError(name, f"{name} must be {allowed}, got {shown}; {todo}.", allowed=allowed, value=value,
                     hint=hint)


def _bound(value: float | None) -> str:
    return POWERS.get(int(value), str(value)) if isinstance(value, int) else str(value)


@dataclass(frozen=True)
class Rule:
    """What one field accepts.

    Arguments:
        kind: ``int``, ``float``, ``bool`` or ``str``; low, high: inclusive bounds (None: the tensor type's, or
        none); low_open: ``low`` itself is refused ("greater than low"); meaning: a note after the range, e.g.
        "(0 = off)".
    """

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    meaning: str = ""

    def bounded(self, datatype: str | None) -> Rule:
        """This rule with integer bounds the tensor type ``datatype`` imposes where it states none.

        Arguments:
            datatype: the field's Triton data type (``INT32``, ``UINT64``, ...), or None.
        """
        if self.kind is not int or datatype not in INT_RANGES:
            return self
        low, high = INT_RANGES[datatype]
        return Rule(int, low if self.low is None else max(self.low, low),
                    high if self.high is None else min(self.high, high), self.low_open, self.meaning)

    @property
    def interval(self) -> str:
        """The bounds of a number as an interval, "(0, 1]" or "[0, 1]" (both bounds set)."""
        return f"{'(' if self.low_open else '['}{self.low}, {self.high}]"

    @property
    def allowed(self) -> str:
        """What the field must be, as the refusal says it."""
        if self.kind is bool:
            text = "true or false"
        elif self.kind is str:
            text = "a string"
        elif self.kind is int:
            text = f"an integer from {_bound(self.low)} to {_bound(self.high)}" if self.low is not None and \
                self.high is not None else f"an integer >= {_bound(self.low)}" if self.low is not None else "an integer"
        elif self.low is not None and self.high is not None:
            text = f"a number in {self.interval}"
        elif self.low is not None:
            text = f"a number greater than {self.low}" if self.low_open else f"a number >= {self.low}"
        else:
            text = "a finite number"
        return f"{text} {self.meaning}" if self.meaning else text

    def checked(self, name: str, value: Any, hint: str | None = None) -> Any:
        """``value`` as the field holds it (ints as floats for a float field, numpy scalars as Python ones), or a
        refusal naming ``name``.

        Arguments:
            name: the field; value: what the request carries; hint: what to do, when refused.
        """
        if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy scalars
            value = value.item()
        if self.kind is bool:
            if not isinstance(value, bool):
                raise refusal(name, self.allowed, value, hint)
            return value
        if self.kind is str:
            if not isinstance(value, str):
                raise refusal(name, self.allowed, value, hint)
            return value
        wanted = int if self.kind is int else int | float
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise refusal(name, self.allowed, value, hint)
        if self.kind is float:
            value = float(value)
            if not math.isfinite(value):
                raise refusal(name, self.allowed, value, hint)
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise refusal(name, self.allowed, value, hint)
        if self.high is not None and value > self.high:
            raise refusal(name, self.allowed, value, hint)
        return value
