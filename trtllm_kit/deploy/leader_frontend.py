"""The kit's OpenAI frontend beside rank 0 on a multi-node leader: one route to the artifact's text model, Triton
reached on loopback, the gateway's key file when one is mounted. The same frontend ``trtllm-kit serve`` runs on
one node; here the ranks are ``mpirun``'s, so only the frontend is started."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from trtllm_kit.artifact import Artifact
from trtllm_kit.deploy.leader_plan import FrontendPlan
from trtllm_kit.serve.fleet.members import context_logits
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.repository_limits import max_batch_size, max_seq_len
from trtllm_kit.serve.server.launcher import grpc_headers


def frontend(plan: FrontendPlan, token: str) -> OpenAIFrontend:
    """The frontend of ``plan`` (its tokenizer loaded).

    Arguments:
        plan: the artifact, the served name and text model, the port, the key file; token: the one Triton's
        APIs demand on this run.
    """
    out = Path(plan.out)
    repo = out / "repo"
    tokenizer = out / "tokenizer"
    models = tuple(sorted(p.parent.name for p in repo.glob("*/config.pbtxt")))
    route = Route(plan.served_name, plan.text_model, tokenizer_dir=tokenizer if tokenizer.is_dir() else None,
                  max_seq_len=max_seq_len(repo), models=models, out=out,
                  context_logits=context_logits(Artifact.read(out)), max_batch_size=max_batch_size(repo))
    config = OpenAIConfig(grpc_url=plan.grpc_url, served_name=plan.served_name, triton_model=plan.text_model,
                          api_keys=Path(plan.api_keys) if plan.api_keys else None,
                          usage_log=Path(plan.usage_log) if plan.usage_log else None, routes=(route,),
                          triton_headers=grpc_headers(token))
    return OpenAIFrontend(config)


async def start(plan: FrontendPlan, token: str) -> web.AppRunner:
    """Start the frontend of ``plan`` on its host and port; ``await runner.cleanup()`` stops it.

    Arguments:
        plan: the frontend plan; token: the one Triton's APIs demand on this run.
    """
    return await start_frontend(frontend(plan, token), plan.host, plan.port)
