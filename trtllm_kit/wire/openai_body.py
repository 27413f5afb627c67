"""A ``GenerationRequest`` as an OpenAI completion body (with vLLM's sampling extras): how the kit's frontend asks
another OpenAI server behind it (Dynamo's frontend, trtllm-serve) for a generation.

Each set field whose row names an OpenAI field (``openai=`` in ``request.py``) goes under that name; a token-id
prompt goes as a list; ``end_id`` -1 (no end token) is vLLM's ``ignore_eos``; the guide is vLLM's ``guided_*``
field (``json``: any JSON object). A streamed body asks for the running usage in every chunk. What the body cannot
carry (an adapter, logprobs, n, beams) is the caller's to refuse before it sends.
"""

from __future__ import annotations

import json
from typing import Any

from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.request import NEVER_END_ID, GenerationRequest

STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}  # each chunk carries the running usage
ANY_JSON = {"type": "object"}  # the schema of ``response_format`` ``json_object``
IGNORE_EOS = "ignore_eos"
OPENAI_ROWS = tuple(row for row in rows(GenerationRequest) if row.openai is not None)


def guided_field(kind: str, guide: str) -> dict[str, Any]:
    """The kit's guide (``request.GUIDE_TYPES``) as vLLM's ``guided_*`` field.

    Arguments:
        kind: the guide type; guide: the guide (a JSON schema or choice list as JSON text, a regex, a grammar).
    """
    if kind == "json":
        return {"guided_json": ANY_JSON}
    if kind in ("json_schema", "choice"):
        return {f"guided_{kind.removesuffix('_schema')}": json.loads(guide)}
    return {"guided_regex" if kind == "regex" else "guided_grammar": guide}


def encode_openai_body(req: GenerationRequest, model: str, *, stream: bool,
                       skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The completion body asking ``model`` for ``req``.

    Arguments:
        req: the request; model: the name the server serves the model under; stream: whether the answer is
        streamed (with the running usage); skip: fields the caller handles itself (not sent).
    """
    prompt = list(req.prompt) if isinstance(req.prompt, tuple) else req.prompt
    body: dict[str, Any] = {"model": model, "prompt": prompt, "stream": stream}
    if stream:
        body["stream_options"] = dict(STREAM_OPTIONS)
    for row in OPENAI_ROWS:
        value = getattr(req, row.name)
        if value not in (None, ()) and row.name not in skip:
            body[str(row.openai)] = list(value) if isinstance(value, tuple) else value
    if req.end_id == NEVER_END_ID and "end_id" not in skip:
        body[IGNORE_EOS] = True
    if req.guide is not None and "guide" not in skip:
        body.update(guided_field(*req.guide))
    return body
