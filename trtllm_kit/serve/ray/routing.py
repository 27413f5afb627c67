"""``serve --ray --router``: which request router sends the frontend's requests to the model's replicas.

``prefix`` is the kit's prefix-affinity router (``prefix_router.py``), ``pow2`` Ray Serve's default (the less loaded
of two replicas drawn at random). ``kv``, the flag's default and ``--dynamo``'s name for routing by cached prefix,
reads as ``prefix``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.enums import Router
from trtllm_kit.errors import KitUsageError

RAY_ROUTERS = {Router.PREFIX: Router.PREFIX, Router.KV: Router.PREFIX, Router.POW2: Router.POW2}
PREFIX_ROUTER = "trtllm_kit.serve.ray.prefix_router.PrefixRouter"


def ray_router(router: Router) -> Router:
    """The router ``--router`` names under ``--ray``.

    Arguments:
        router: the flag's value.
    """
    if router not in RAY_ROUTERS:
        raise KitUsageError(f"--router {router} is not available with --ray; give --router prefix or --router pow2.")
    return RAY_ROUTERS[router]


def router_config(router: Router, tokens_per_block: int) -> dict[str, Any]:
    """The model deployment's ``request_router_config`` (empty: Ray Serve's default router).

    Arguments:
        router: ``prefix`` or ``pow2``; tokens_per_block: the engine's KV cache block (the prefix's length).
    """
    if ray_router(router) is Router.POW2:
        return {}
    return {"request_router_class": PREFIX_ROUTER, "request_router_kwargs": {"tokens_per_block": tokens_per_block}}


def artifact_block(out: Path) -> int:
    """The KV cache block, in tokens, OUT's repository was built with.

    Arguments:
        out: a cpu or llmapi artifact.
    """
    repo = Artifact.read(out).records.repo
    if repo is None:
        raise KitUsageError(f"{out} has no repository record; build it with the repo stage.")
    return repo.limits.tokens_per_block
