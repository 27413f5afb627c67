"""The frontend in front of one artifact served by another server (Dynamo's frontend, a Ray Serve deployment): the
one route to it, and the configuration that serves that route alone.

The route's one model takes token ids (the frontend tokenizes text when the artifact has a tokenizer) within the
artifact's sequence and batch bounds, and scores prompts itself (``context_logits`` None); its client is the
frontend's to set as it opens (the route has no Triton server to reach).
"""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.repository_limits import max_batch_size, max_seq_len
from trtllm_kit.serve.servable import servable


def artifact_route(out: Path, name: str, model: str) -> Route:
    """The route serving OUT under ``name`` through ``model``.

    Arguments:
        out: the artifact; name: the served name; model: what the route's client calls the model behind it.
    """
    target = servable(out)
    return Route(name, model, model, target.tokenizer_dir, max_seq_len(target.repo), 1, (model,), out,
                 context_logits=None, max_batch_size=max_batch_size(target.repo))


def route_config(route: Route, url: str, *, api_key: str | None = None, api_keys: Path | None = None,
                 usage_log: Path | None = None) -> OpenAIConfig:
    """The frontend's configuration serving ``route`` alone, with the gateway of ``api_keys``.

    Arguments:
        route: ``artifact_route``; url: where the server behind it is (what the frontend reports); api_key: the
        serve's one key; api_keys, usage_log: the gateway's key file and usage log (None: no gateway).
    """
    return OpenAIConfig(grpc_url=url, served_name=route.name, triton_model=route.triton_model, api_key=api_key,
                        api_keys=api_keys, usage_log=usage_log, routes=(route,))
