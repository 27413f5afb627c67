"""Structured output: OpenAI's ``response_format`` (``json_object``, ``json_schema``) and vLLM's ``guided_json``,
``guided_regex``, ``guided_choice`` and ``guided_grammar``, as the engine's guide (``guided_decoding_guide_type``
and ``guided_decoding_guide``: ``json``, ``json_schema``, ``regex``, ``choice``, ``ebnf_grammar``)."""

from __future__ import annotations

import json
from typing import Any

from trtllm_kit.serve.openai.protocol import RequestError

GUIDED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
Guide = tuple[str, str]  # (guide type, guide)


def parse_guide(body: dict[str, Any]) -> Guide | None:
    """The request's guide, or None when it asks for free text.

    Arguments:
        body: the JSON request body.
    """
    given = [name for name in GUIDED_FIELDS if body.get(name) is not None
             and not (name == "response_format" and body[name] == {"type": "text"})]
    if not given:
        return None
    if len(given) > 1:
        raise RequestError(f"{given[0]} and {given[1]} both ask for structured output; send one of them.",
                           param=given[1])
    name = given[0]
    value = body[name]
    if name == "response_format":
        return _response_format(value)
    if name == "guided_json":
        if isinstance(value, dict):
            return "json_schema", json.dumps(value)
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                raise RequestError("guided_json must be a JSON schema (an object, or its JSON text).",
                                   param=name) from None
            return "json_schema", value
        raise RequestError(f"guided_json must be a JSON schema object, got {value!r:.60}.", param=name)
    if name == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise RequestError(f"guided_choice must be a non-empty list of strings, got {value!r:.60}.", param=name)
        return "choice", json.dumps(value)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{name} must be a non-empty string, got {value!r:.60}.", param=name)
    return ("regex" if name == "guided_regex" else "ebnf_grammar"), value


def _response_format(value: Any) -> Guide:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return "json", ""
    schema = value.get("json_schema") if isinstance(value, dict) else None
    if kind == "json_schema" and isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
        return "json_schema", json.dumps(schema["schema"])
    raise RequestError(f"response_format must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or "
                       f"{{\"type\": \"json_schema\", \"json_schema\": {{\"name\": ..., \"schema\": {{...}}}}}}, got "
                       f"{value!r:.80}.", param="response_format")
