"""The scalar rows of the field table, encoded and decoded by the table alone, and the one rule for a field a
model cannot take: a strict field is refused, any other is not sent (the model's default applies).

``declared`` is the model's inputs (name → Triton type, from its config); None means every input of the dialect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trtllm_kit.wire.fields import Dialect, Row, rows
from trtllm_kit.wire.request import GenerationRequest
from trtllm_kit.wire.rules import WireError
from trtllm_kit.wire.tensor import read_scalar, scalar_array

SPOKEN = {"trtllm": "the tensorrt_llm model", "llmapi": "the llmapi model",
          "text": "the text interface (ensemble, tensorrt_llm_bls)"}
SCALARS = tuple(r for r in rows(GenerationRequest) if r.is_scalar)


def field_row(name: str) -> Row:
    """The declared row of a field of ``GenerationRequest``.

    Arguments:
        name: the field.
    """
    return next(r for r in rows(GenerationRequest) if r.name == name)


def may_send(row: Row, dialect: Dialect, declared: Mapping[str, str] | None, names: tuple[str, ...] = ()) -> bool:
    """Whether a set field goes out: its tensors exist in the dialect and the model declares them; otherwise a
    strict field is refused and any other is left out.

    Arguments:
        row: the field; dialect: where it goes; declared: the model's inputs (None: all of the dialect's);
        names: the tensors this value needs (default: the row's).
    """
    names = names or row.tensors(dialect)
    if names and (declared is None or all(n in declared for n in names)):
        return True
    if not row.wire.strict:
        return False
    if not names:
        raise WireError(row.name, f"{row.name} cannot be sent to {SPOKEN[dialect]}, which has no input for it; leave "
                                  f"{row.name} out, or serve a model that takes it.")
    missing = next(n for n in names if declared is not None and n not in declared)
    raise WireError(row.name, f"{row.name} is not served by this model: it declares no {missing} input; leave "
                              f"{row.name} out, or rebuild the repository.")


def encode_scalars(req: GenerationRequest, dialect: Dialect, declared: Mapping[str, str] | None,
                   skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The set scalar fields as tensors of ``dialect``.

    Arguments:
        req: the request; dialect: where it goes; declared: the model's inputs (None: all of the dialect's);
        skip: fields the dialect's codec encodes itself.
    """
    arrays: dict[str, np.ndarray] = {}
    for row in SCALARS:
        value = getattr(req, row.name)
        if value is not None and row.name not in skip and may_send(row, dialect, declared):
            arrays[row.tensors(dialect)[0]] = scalar_array(value, str(row.wire.dtype))
    return arrays


def decode_scalars(arrays: Mapping[str, np.ndarray], dialect: Dialect) -> dict[str, Any]:
    """The scalar fields ``arrays`` carry, by field name; a bad value is refused naming its tensor.

    Arguments:
        arrays: the request's tensors by name; dialect: theirs.
    """
    values: dict[str, Any] = {}
    for row in SCALARS:
        name = row.tensor(dialect)
        if name is not None and name in arrays:
            values[row.name] = read_scalar(arrays, name, row.rule)
    return values


def record(values: dict[str, Any], dialect: Dialect) -> GenerationRequest:
    """The request of decoded ``values``; a refusal names the tensor the value came in.

    Arguments:
        values: field → value; dialect: where they came from.
    """
    try:
        return GenerationRequest(**values)
    except WireError as exc:
        row = next((r for r in SCALARS if r.name == exc.field), None)
        name = None if row is None else row.tensor(dialect)
        if name is None:
            raise
        raise exc.named(name) from None


def refuse_unsent(req: GenerationRequest, dialect: Dialect, handled: tuple[str, ...],
                  declared: Mapping[str, str] | None) -> None:
    """Refuse a set structured field the dialect cannot carry, when it is strict (the others are not sent).

    Arguments:
        req: the request; dialect: where it goes; handled: the structured fields the dialect's codec encodes;
        declared: the model's inputs.
    """
    for row in rows(GenerationRequest):
        if not row.is_scalar and row.name not in handled and getattr(req, row.name) not in (None, ()):
            assert not row.tensors(dialect), f"the {dialect} codec encodes {row.name}"
            may_send(row, dialect, declared)
