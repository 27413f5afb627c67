"""The bounds on a structured-output guide: its length and its nesting, counted as the guide's own language reads
it (brackets inside JSON strings, escaped or classed parentheses in a regex, quoted ones or comments in EBNF do not
nest), each refused in a sentence that names the field, the value found and the bound."""

from __future__ import annotations

import json

import pytest

from trtllm_kit.runtime.guide_limits import (
    MAX_GUIDE_CHARS,
    MAX_GUIDE_DEPTH,
    ebnf_depth,
    guide_problem,
    json_depth,
    regex_depth,
)


def nested_schema(depth: int) -> str:
    """A JSON schema of arrays of arrays, ``depth`` JSON objects deep, as text (no recursion to write it)."""
    return '{"type": "array", "items": ' * (depth - 1) + '{"type": "string"}' + "}" * (depth - 1)


@pytest.mark.parametrize(("text", "depth"), [
    ("", 0), ('{"type": "object"}', 1), (nested_schema(5), 5), ('["a", ["b"]]', 2),
    ('{"enum": ["{{{[[[", "]]]}}}"]}', 2),  # brackets in strings
    ('{"pattern": "\\"{{{"}', 1),  # an escaped quote does not end the string
    ('["\\\\", [[]]]', 3),  # an escaped backslash does
])
def test_json_depth_counts_objects_and_arrays_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


@pytest.mark.parametrize(("text", "depth"), [
    ("a+", 0), ("(a(b)c)", 2), (r"\((a)\)", 1), ("[(]((a))", 2), (r"[\]((]a", 0), ("(" * 40 + "a" + ")" * 40, 40),
])
def test_regex_depth_skips_escapes_and_classes(text: str, depth: int) -> None:
    assert regex_depth(text) == depth


@pytest.mark.parametrize(("text", "depth"), [
    ('root ::= ("a" ("b"))', 2), ('root ::= "((((" [(((] (x)', 1), ('root ::= "\\"((" (x)', 1),
    ("root ::= (x) # (((((\nx ::= ((y))", 2), ("root ::= '(((' (x)", 1),
])
def test_ebnf_depth_skips_literals_classes_and_comments(text: str, depth: int) -> None:
    assert ebnf_depth(text) == depth


def test_a_guide_within_the_bounds_passes() -> None:
    at_the_bound = nested_schema(MAX_GUIDE_DEPTH)
    assert guide_problem("guided_json", "json_schema", at_the_bound) is None
    assert guide_problem("guided_regex", "regex", "(" * MAX_GUIDE_DEPTH + "a" + ")" * MAX_GUIDE_DEPTH) is None
    assert guide_problem("guided_choice", "choice", json.dumps(["x" * 100] * 600)) is None
    assert guide_problem("response_format", "json", "") is None


@pytest.mark.parametrize(("field", "guide_type", "text", "message"), [
    ("guided_json", "json_schema", nested_schema(1000),
     "guided_json nests 1000 levels deep; a structured-output guide may nest at most 32: flatten it."),
    ("guided_regex", "regex", "(" * 2000 + "a" + ")" * 2000,
     "guided_regex nests 2000 levels deep; a structured-output guide may nest at most 32: flatten it."),
    ("guided_grammar", "ebnf_grammar", "root ::= " + "(" * 3000 + '"a"' + ")" * 3000,
     "guided_grammar nests 3000 levels deep; a structured-output guide may nest at most 32: flatten it."),
    ("guided_decoding_guide (json_schema)", "json_schema", json.dumps({"enum": ["v" * 20] * 100_000}),
     "guided_decoding_guide (json_schema) has 2400010 characters; a structured-output guide may have at most "
     "65536: send a smaller one."),
    ("guided_choice", "choice", json.dumps(["x"] * (MAX_GUIDE_CHARS // 5 + 1)),
     f"guided_choice has {len(json.dumps(['x'] * (MAX_GUIDE_CHARS // 5 + 1)))} characters; a structured-output "
     "guide may have at most 65536: send a smaller one."),
])
def test_a_guide_past_a_bound_is_refused_naming_the_field(field: str, guide_type: str, text: str,
                                                          message: str) -> None:
    assert guide_problem(field, guide_type, text) == message
