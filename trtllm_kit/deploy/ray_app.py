"""The Ray Serve application a ``deploy ray`` RayService imports (``import_path: trtllm_kit.deploy.ray_app:app``).

Ray Serve calls ``app`` with the ``args`` of ``serveConfigV2``; the deployment's replicas, resources and autoscaling
come from the config's ``deployments`` entry, which overrides what is bound here.
"""

from __future__ import annotations

from typing import Any

IMPORT_PATH = "trtllm_kit.deploy.ray_app:app"


def app(args: dict[str, str]) -> Any:
    """The model deployment of the artifact at ``args["out"]`` (``serve/ray/replica.py``), bound.

    Arguments:
        args: ``serveConfigV2``'s application arguments: ``out``, the artifact's path in the worker pods.
    """
    from ray import serve

    from trtllm_kit.serve.ray.driver import DEPLOYMENT
    from trtllm_kit.serve.ray.replica import Replica

    return serve.deployment(name=DEPLOYMENT)(Replica).bind(args["out"])
