"""The frontend in front of one artifact served by another server (Dynamo's frontend, a Ray Serve deployment): the
one route to it, and the configuration that serves that route alone.

The route's one model takes token ids (the frontend tokenizes text when the artifact has a tokenizer) within the
artifact's sequence and batch bounds, and scores prompts itself (``context_logits`` None); its client is the
frontend's to set as it opens (the route has no Triton server to reach). The route choice is a plain serve's
(``bls_route.bls_num_draft_tokens``): an artifact whose OpenAI requests speculate through ``tensorrt_llm_bls``
(draft-target on the engine target) has no route here, and is refused in one sentence (``bls_refusal``).
"""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.artifact import Artifact
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.openai.bls_route import bls_num_draft_tokens
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.repository_limits import max_batch_size, max_seq_len
from trtllm_kit.serve.servable import servable
from trtllm_kit.spec.speculative import SpeculativeOptions

FRONTENDS = "serve --dynamo and serve --ray"  # the frontends in front of another server


def bls_refusal(out: Path, target: str, speculative: SpeculativeOptions) -> str | None:
    """Why no frontend in front of another server can serve OUT (one sentence), or None: a plain serve sends its
    OpenAI requests through ``tensorrt_llm_bls`` (``bls_num_draft_tokens`` is not None), which such a frontend,
    streaming from the kit's workers or replicas and not from Triton, cannot reach.

    Arguments:
        out: the artifact; target: its target (``Artifact.target``); speculative: its ``[speculative]`` table.
    """
    if bls_num_draft_tokens(target, speculative) is None:
        return None
    return (f"{out} is built with --target {target} --speculative {speculative.mode}, which speculates through "
            f"tensorrt_llm_bls, and {FRONTENDS} stream from no Triton server; serve it without them: trtllm-kit "
            f"serve {out} --openai-port PORT.")


def check_bls_route(out: Path) -> None:
    """Refuse OUT in ``bls_refusal``'s sentence, before anything starts.

    Arguments:
        out: the artifact.
    """
    artifact = Artifact.read(out)
    refusal = bls_refusal(out, artifact.target, artifact.spec.speculative)
    if refusal is not None:
        raise KitUsageError(refusal)


def artifact_route(out: Path, name: str, model: str) -> Route:
    """The route serving OUT under ``name`` through ``model``; refused (``check_bls_route``) where a plain serve
    would route through ``tensorrt_llm_bls``.

    Arguments:
        out: the artifact; name: the served name; model: what the route's client calls the model behind it.
    """
    check_bls_route(out)
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
