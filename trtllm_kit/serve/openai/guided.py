"""Structured output: OpenAI's ``response_format`` (``json_object``, ``json_schema``) and vLLM's ``guided_json``,
``guided_regex``, ``guided_choice`` and ``guided_grammar``, as the engine's guide (``guided_decoding_guide_type``
and ``guided_decoding_guide``: ``json``, ``json_schema``, ``regex``, ``choice``, ``ebnf_grammar``).

A guide longer or deeper than ``runtime/guide_limits.py`` allows is refused here, before it reaches Triton; one the
model refuses (malformed, or past its compile time or memory) comes back as a 400 naming the field that carried it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trtllm_kit.runtime.guide_limits import GUIDE_INPUT, guide_problem
from trtllm_kit.serve.http.errors import HTTPError

GUIDED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
Guide = tuple[str, str]  # (guide type, guide)
MODEL_REFUSAL = re.compile(re.escape(GUIDE_INPUT) + r" \((\w+)\) (.+)")  # "guided_decoding_guide (regex) ..."


def parse_guide(body: dict[str, Any]) -> Guide | None:
    """The request's guide, or None when it asks for free text.

    Arguments:
        body: the JSON request body.
    """
    name = structured_field(body)
    if name is None:
        return None
    guide = _guide(name, body[name])
    problem = guide_problem(name, *guide)
    if problem is not None:
        raise HTTPError(problem, param=name)
    return guide


def structured_field(body: dict[str, Any]) -> str | None:
    """The field that asks for structured output (None: none does); two such fields are refused.

    Arguments:
        body: the JSON request body.
    """
    given = [name for name in GUIDED_FIELDS if body.get(name) is not None
             and not (name == "response_format" and body[name] == {"type": "text"})]
    if len(given) > 1:
        raise HTTPError(f"{given[0]} and {given[1]} both ask for structured output; send one of them.",
                        param=given[1])
    return given[0] if given else None


def model_refusal(message: str, guide_field: str | None) -> HTTPError | None:
    """The 400 of a guide the model refused (``message`` names ``guided_decoding_guide``), naming the request's own
    field instead; None for any other failure.

    Arguments:
        message: the model's error; guide_field: the request's structured-output field, when it has one.
    """
    found = MODEL_REFUSAL.search(message)
    if found is None:
        return None
    name = guide_field or "response_format"
    return HTTPError(f"{name} {found.group(2)}", param=name)


def _guide(name: str, value: Any) -> Guide:
    """The guide of the structured-output field ``name``."""
    if name == "response_format":
        return _response_format(value)
    if name == "guided_json":
        if isinstance(value, dict):
            return "json_schema", json.dumps(value)
        if isinstance(value, str):
            problem = guide_problem(name, "json_schema", value)  # before parsing: json.loads recurses
            if problem is not None:
                raise HTTPError(problem, param=name)
            try:
                json.loads(value)
            except (ValueError, RecursionError):
                raise HTTPError("guided_json must be a JSON schema (an object, or its JSON text).",
                                param=name) from None
            return "json_schema", value
        raise HTTPError(f"guided_json must be a JSON schema object, got {value!r:.60}.", param=name)
    if name == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise HTTPError(f"guided_choice must be a non-empty list of strings, got {value!r:.60}.", param=name)
        return "choice", json.dumps(value)
    if not isinstance(value, str) or not value:
        raise HTTPError(f"{name} must be a non-empty string, got {value!r:.60}.", param=name)
    return ("regex" if name == "guided_regex" else "ebnf_grammar"), value


def _response_format(value: Any) -> Guide:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return "json", ""
    schema = value.get("json_schema") if isinstance(value, dict) else None
    if kind == "json_schema" and isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
        return "json_schema", json.dumps(schema["schema"])
    raise HTTPError(f"response_format must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or "
                    f"{{\"type\": \"json_schema\", \"json_schema\": {{\"name\": ..., \"schema\": {{...}}}}}}, got "
                    f"{value!r:.80}.", param="response_format")
