"""The field table: each field of the generation request declared once, in its dataclass, with what it means when
absent, its rule and its tensor in each dialect.

A field is declared where the record declares it: ``field(default=None, metadata=wire(help, absent, rule, dtype,
trtllm=..., llmapi=..., text=..., strict=...))``, as every field of ``request.py`` is.

A field upstream's models also take says where its input stands in their ``config.pbtxt``: ``trtllm_at`` among
the ``tensorrt_llm`` model's inputs, ``text_at`` among the text interface's (``placed`` puts it there; the two
dialects order their inputs differently).

A field whose value depends on the tokens already generated says how it continues when Dynamo migrates its request
to another worker (``Migration``); the others continue unchanged.

``rows(cls)`` reads the declarations back. A row with a ``dtype`` is a scalar: one tensor of that type per dialect
that has a name for it, encoded and decoded by the table alone (``scalars.py``); a row without one is structured
(the prompt, stop words, logprobs, guide, LoRA, disaggregation), its tensor names listed for the record and its
codec written in each dialect's module. The dialects: ``trtllm`` (the ``tensorrt_llm`` model's tensors, on both
the engine and cpu targets), ``llmapi`` (the llmapi target's model) and ``text`` (the text interface of
``ensemble`` and ``tensorrt_llm_bls``). A row also says whether an OpenAI completion body carries the field, and
under which name where it differs (``openai=``, encoded by ``openai_body.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Literal

from trtllm_kit.wire.rules import Rule

WIRE_KEY = "trtllm_kit.wire"
Dialect = Literal["trtllm", "llmapi", "text"]
DIALECTS: tuple[Dialect, ...] = ("trtllm", "llmapi", "text")
Names = str | tuple[str, ...] | None


@dataclass(frozen=True)
class Migration:
    """How a field continues when its request moves to another worker with the tokens generated so far appended
    to its prompt: ``reduced`` by those tokens, ``dropped`` (the first chunk, already sent, answered it), or
    ``refused`` while it is set (``why``: the refusal's end, what the other worker cannot resume and what to do;
    ``sampled``: only when the request samples rather than decodes greedily)."""

    rule: Literal["reduced", "dropped", "refused"]
    why: str = ""
    sampled: bool = False


@dataclass(frozen=True)
class Wire:
    """How one field travels.

    Arguments:
        help: what the field means; default: what an absent value means to the engine (None: the model's own,
        said in ``help``); rule: the values it accepts (None: a structured field, checked by the record);
        dtype: the Triton data type of its tensor (None: structured); trtllm, llmapi, text: its tensor in each
        dialect (a tuple for a structured field; None: the dialect cannot carry it); strict: a request that sets it
        is refused where its tensor is missing (the dialect has none, or the model does not declare it), rather
        than sent without it; openai: the field in an OpenAI completion body (True: under its own name; a string:
        under that name; False: the body has none); openai_off: a value an OpenAI body may send for the default
        (vLLM's own "off", where the row's default is another; None: none); trtllm_at, text_at: its input's
        index among upstream's inputs of the dialect, in config.pbtxt's order (None: the kit's own input, after
        upstream's); migration: how it continues on another worker (None: unchanged); beams: it sets or weighs
        beam search, which the kit's decoders do not run (a value other than ``default`` is refused);
        llmapi_rule: the narrower values the LLM API's ``SamplingParams`` takes, which it leaves to its caller to
        check (None: ``rule``).
    """

    help: str
    default: Any
    rule: Rule | None
    dtype: str | None
    trtllm: Names = None
    llmapi: Names = None
    text: Names = None
    strict: bool = False
    openai: str | bool = False
    openai_off: Any = None
    trtllm_at: int | None = None
    text_at: int | None = None
    migration: Migration | None = None
    beams: bool = False
    llmapi_rule: Rule | None = None


def wire(help: str, default: Any = None, rule: Rule | None = None, dtype: str | None = None, *,
         trtllm: Names = None, llmapi: Names = None, text: Names = None, strict: bool = False,
         openai: str | bool = False, openai_off: Any = None, trtllm_at: int | None = None,
         text_at: int | None = None, migration: Migration | None = None, beams: bool = False,
         llmapi_rule: Rule | None = None) -> dict[str, Wire]:
    """Field metadata declaring a field of the wire.

    Arguments:
        help, default, rule, dtype, trtllm, llmapi, text, strict, openai, openai_off, trtllm_at, text_at,
        migration, beams, llmapi_rule: the ``Wire`` fields.
    """
    return {WIRE_KEY: Wire(help, default, rule, dtype, trtllm, llmapi, text, strict, openai, openai_off, trtllm_at,
                           text_at, migration, beams, llmapi_rule)}


@dataclass(frozen=True)
class Row:
    """A declared field, as the codecs and tests see it."""

    name: str
    wire: Wire

    @property
    def is_scalar(self) -> bool:
        """Whether the field is one tensor of ``dtype`` in every dialect that carries it."""
        return self.wire.dtype is not None

    @property
    def rule(self) -> Rule | None:
        """The field's rule with its tensor type's integer bounds."""
        return None if self.wire.rule is None else self.wire.rule.bounded(self.wire.dtype)

    @property
    def openai(self) -> str | None:
        """The field's name in an OpenAI completion body (None: the body has none)."""
        name = self.wire.openai
        return name if isinstance(name, str) else self.name if name else None

    def place(self, dialect: Dialect) -> int | None:
        """The index of the field's input among upstream's inputs of ``dialect`` (None: not one of upstream's).

        Arguments:
            dialect: ``trtllm`` or ``text`` (the llmapi model's order is the kit's).
        """
        return self.wire.trtllm_at if dialect == "trtllm" else self.wire.text_at if dialect == "text" else None

    def tensors(self, dialect: Dialect) -> tuple[str, ...]:
        """The field's tensors in ``dialect`` (empty: the dialect cannot carry it).

        Arguments:
            dialect: ``trtllm``, ``llmapi`` or ``text``.
        """
        names: Names = getattr(self.wire, dialect)
        return () if names is None else (names,) if isinstance(names, str) else names

    def tensor(self, dialect: Dialect) -> str | None:
        """A scalar field's tensor in ``dialect`` (None: the dialect cannot carry it).

        Arguments:
            dialect: ``trtllm``, ``llmapi`` or ``text``.
        """
        assert self.is_scalar, f"{self.name} is a structured field"
        names = self.tensors(dialect)
        return names[0] if names else None


@functools.cache
def rows(cls: type) -> tuple[Row, ...]:
    """The declared fields of a record, in order.

    Arguments:
        cls: the record's dataclass.
    """
    return tuple(Row(f.name, f.metadata[WIRE_KEY]) for f in fields(cls) if WIRE_KEY in f.metadata)


def placed(others: tuple[str, ...], dialect: Dialect, declared: tuple[Row, ...]) -> tuple[str, ...]:
    """Upstream's inputs of ``dialect`` in config.pbtxt's order: ``others`` (the inputs no row places, in order)
    with each placed row's input put at its index.

    Arguments:
        others: the dialect's other inputs, in order; dialect: ``trtllm`` or ``text``; declared: the rows.
    """
    order = list(others)
    for index, name in sorted((at, row.tensors(dialect)[0]) for row in declared
                              if (at := row.place(dialect)) is not None):
        order.insert(index, name)
    return tuple(order)
