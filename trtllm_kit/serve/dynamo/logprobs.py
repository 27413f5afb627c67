"""Logprobs through Dynamo's frontend: what the kit's client asks it for, and the kit's scored tokens (``Scored``) read
back from its answer.

Dynamo's frontend names a logprobs token by its text, and two tokens that decode alike (two halves of a character, each
"\ufffd") would be one; asked ``return_tokens_as_token_ids``, it names each token and each alternative ``token_id:N``
instead. It takes completions ``logprobs`` up to 5: the worker's alternatives are asked in the kit's annotation
(``LOGPROBS_ANNOTATION``, read by the worker in ``request.py``), which goes to 20 as chat's ``top_logprobs`` do. The
prompt's logprobs (echo with logprobs), for which the frontend has no field, are asked in another annotation and arrive
in the first chunk's ``nvext.engine_data``, which the frontend passes on when ``extra_fields`` names it.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.wire import GenerationRequest, Scored

TOKENS_AS_IDS = "return_tokens_as_token_ids"  # Dynamo's frontend names logprobs' tokens TOKEN_ID_PREFIX + id
TOKEN_ID_PREFIX = "token_id:"
DYNAMO_MAX_LOGPROBS = 5  # the completions logprobs Dynamo's frontend takes
ENGINE_DATA = "engine_data"  # the worker's own data, passed on as nvext.engine_data when asked in extra_fields
LOGPROBS_ANNOTATION = "trtllm-kit.logprobs:"  # + N: the alternatives asked per token, which the frontend caps at 5
PROMPT_LOGPROBS_ANNOTATION = "trtllm-kit.prompt_logprobs:"  # + N: the prompt's logprobs with N alternatives
PROMPT_SCORED = "prompt_scored"  # engine_data's key of the prompt's scored tokens


def logprob_fields(req: GenerationRequest) -> dict[str, Any]:
    """The completion body's fields asking for ``req``'s logprobs (none when it asks for none).

    Arguments:
        req: the engine request.
    """
    fields: dict[str, Any] = {}
    annotations = []
    if req.logprobs is not None:
        fields.update({"logprobs": min(req.logprobs, DYNAMO_MAX_LOGPROBS), TOKENS_AS_IDS: True})
        annotations.append(f"{LOGPROBS_ANNOTATION}{req.logprobs}")
    if req.prompt_logprobs is not None:
        annotations.append(f"{PROMPT_LOGPROBS_ANNOTATION}{req.prompt_logprobs}")
    if annotations:
        extra = {"extra_fields": [ENGINE_DATA]} if req.prompt_logprobs is not None else {}
        fields["nvext"] = {"annotations": annotations, **extra}
    return fields


def prompt_scored(event: dict[str, Any]) -> tuple[Scored, ...] | None:
    """The prompt's scored tokens a chunk's ``nvext.engine_data`` carries (None: it carries none).

    Arguments:
        event: the chunk's JSON.
    """
    nvext = event.get("nvext") or {}
    rows = (nvext.get(ENGINE_DATA) or {}).get(PROMPT_SCORED) if isinstance(nvext, dict) else None
    if rows is None:
        return None
    return tuple((int(token), None if logprob is None else float(logprob),
                  tuple((int(t), float(v)) for t, v in alternatives)) for token, logprob, alternatives in rows)


def scored_tokens(logprobs: dict[str, Any], num_top: int) -> tuple[Scored, ...]:
    """The scored tokens of a completion choice's ``logprobs`` object named by id (``TOKENS_AS_IDS``): each token
    with its logprob and the first ``num_top`` entries of its ``top_logprobs``, which are the worker's alternatives,
    best first (Dynamo's frontend appends the token itself after them when they do not hold it). The token's logprob
    is read from ``top_logprobs``, which holds it at full precision (``token_logprobs`` is rounded to float32's
    shortest digits).

    Arguments:
        logprobs: ``tokens``, ``token_logprobs`` and ``top_logprobs``; num_top: the alternatives asked per token.
    """
    tokens, values = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or [{}] * len(tokens)
    if not len(tokens) == len(values) == len(tops):
        raise GenerationError(f"Dynamo's frontend scored {len(tokens)} tokens with {len(values)} logprobs and "
                              f"{len(tops)} top_logprobs; each token needs one of each.", status=502)
    return tuple((token_id(token), float((top or {}).get(token, value)),
                  tuple((token_id(t), float(v)) for t, v in list((top or {}).items())[:num_top]))
                 for token, value, top in zip(tokens, values, tops, strict=True))


def token_id(token: str) -> int:
    """The id in a token Dynamo's frontend named ``token_id:N``.

    Arguments:
        token: the token as the frontend named it.
    """
    digits = token.removeprefix(TOKEN_ID_PREFIX)
    if digits == token or not digits.isdigit():
        raise GenerationError(f"Dynamo's frontend named a logprobs token {token!r}, not {TOKEN_ID_PREFIX}N; run "
                              f"an ai-dynamo that honours {TOKENS_AS_IDS}.", status=502)
    return int(digits)
