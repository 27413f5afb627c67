"""The Ray Serve application a ``deploy ray`` RayService imports (``import_path: trtllm_kit.deploy.ray_app:app``).

Ray Serve calls ``app`` with the ``args`` of ``serveConfigV2``; the deployments' replicas, resources and autoscaling
come from the config's ``deployments`` entries, which override what is bound here. The ingress is the kit's OpenAI
frontend (``serve/ray/ingress.py``), given the model deployment's handle.
"""

from __future__ import annotations

from typing import Any

IMPORT_PATH = "trtllm_kit.deploy.ray_app:app"


def app(args: dict[str, Any]) -> Any:
    """The frontend deployment in front of the model deployment of the artifact at ``args["out"]``, bound.

    Arguments:
        args: ``serveConfigV2``'s application arguments: ``out``, the artifact's path in the pods; ``name``, the
        served name; ``port``, the frontend's OpenAI port on the head pod; ``api_keys`` and ``usage_log``, the
        gateway's files on the head pod (absent: no gateway).
    """
    from ray import serve

    from trtllm_kit.serve.ray.driver import DEPLOYMENT
    from trtllm_kit.serve.ray.ingress import FRONTEND, Ingress
    from trtllm_kit.serve.ray.replica import Replica

    model = serve.deployment(name=DEPLOYMENT)(Replica).bind(args["out"])
    return serve.deployment(name=FRONTEND)(Ingress).bind(model, args["out"], args["name"], int(args["port"]),
                                                         args.get("api_keys"), args.get("usage_log"))
