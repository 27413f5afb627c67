"""The bounds on a structured-output guide (docs/request-limits.md lists them), stated once for the OpenAI frontend,
which refuses a guide past them before it reaches Triton, and for the CPU runtime's models, which refuse it for
clients of Triton's own ports and compile the rest in a process of their own (``guide_service.py``).

A guide is refused when its text is longer than ``MAX_GUIDE_CHARS`` or nests deeper than ``MAX_GUIDE_DEPTH``
(JSON objects and arrays; groups of a regex or an EBNF grammar), when it does not compile within
``GUIDE_COMPILE_TIMEOUT_S`` or within ``GUIDE_COMPILE_MEMORY_BYTES`` of memory, and when it is malformed. Every
refusal of the models begins with ``guide_field(guide_type)``, so that the frontend can name its own field instead.
No heavy import: the frontend loads this module.
"""

from __future__ import annotations

from trtllm_kit.errors import KitUsageError

MAX_GUIDE_CHARS = 65536  # characters of a guide's text (a JSON schema, regex, EBNF grammar or choice list)
MAX_GUIDE_DEPTH = 32  # nesting of a guide: JSON objects and arrays, groups of a regex or an EBNF grammar
GUIDE_COMPILE_TIMEOUT_S = 10.0  # a guide that compiles longer is refused (its compile process is killed)
GUIDE_COMPILE_MEMORY_BYTES = 1 << 30  # address space a guide's compile process may add to its own
MAX_CONCURRENT_COMPILES = 2  # compiles at once per model instance; later guides wait their turn
GUIDE_CACHE_ENTRIES = 128  # guides kept compiled (or refused) per model instance
GUIDE_CACHE_BYTES = 256 << 20  # bytes of compiled guides kept per model instance
GUIDE_INPUT = "guided_decoding_guide"  # the tensorrt_llm input that carries a guide


class GuideRefused(KitUsageError):
    """A guide the client must change: malformed, or past one of this module's bounds."""


def guide_field(guide_type: str) -> str:
    """How the models name a guide in a refusal: the input and its type, e.g. ``guided_decoding_guide (regex)``.

    Arguments:
        guide_type: the guide's ``guided_decoding_guide_type``.
    """
    return f"{GUIDE_INPUT} ({guide_type})"


def guide_problem(field: str, guide_type: str, text: str) -> str | None:
    """A sentence naming ``field`` when the guide is longer or nests deeper than the bounds allow, else None.

    Arguments:
        field: what the sentence calls the guide (the request field that carried it); guide_type: ``json``,
        ``json_schema``, ``regex``, ``ebnf_grammar`` or ``choice``; text: the guide.
    """
    if len(text) > MAX_GUIDE_CHARS:
        return (f"{field} has {len(text)} characters; a structured-output guide may have at most {MAX_GUIDE_CHARS}: "
                "send a smaller one.")
    depth = (regex_depth if guide_type == "regex" else ebnf_depth if guide_type == "ebnf_grammar"
             else json_depth)(text)
    if depth > MAX_GUIDE_DEPTH:
        return (f"{field} nests {depth} levels deep; a structured-output guide may nest at most {MAX_GUIDE_DEPTH}: "
                "flatten it.")
    return None


def json_depth(text: str) -> int:
    """The deepest nesting of objects and arrays in JSON text (strings skipped; the text need not be valid).

    Arguments:
        text: JSON text.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "}]":
            depth -= 1
    return deepest


def regex_depth(text: str) -> int:
    """The deepest nesting of groups in a regex (escaped characters and character classes skipped).

    Arguments:
        text: the regex.
    """
    return _group_depth(text, quotes="", comment="")


def ebnf_depth(text: str) -> int:
    """The deepest nesting of groups in an EBNF grammar (string literals, character classes and comments skipped).

    Arguments:
        text: the grammar.
    """
    return _group_depth(text, quotes="\"'", comment="#")


def _group_depth(text: str, quotes: str, comment: str) -> int:
    depth = deepest = 0
    closing = ""  # the character that ends the literal, class or comment being read, if any
    escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and closing != "\n":
            escaped = True
        elif closing:
            closing = "" if char == closing else closing
        elif char == "[":
            closing = "]"
        elif char in quotes:
            closing = char
        elif char in comment:
            closing = "\n"
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest
