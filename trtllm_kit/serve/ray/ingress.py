"""The kit's OpenAI frontend as a Ray Serve deployment: the HTTP entry of a ``deploy ray`` application.

On a cluster no ``serve`` binds a socket for the driver (``driver.py``); the frontend runs instead as the
application's ingress deployment, in a replica of its own on the head (the custom resource ``FRONTEND_RESOURCE``,
which only the head offers), listening on ``0.0.0.0:PORT`` of the head pod and streaming each request to the model
deployment through the handle Ray Serve passes it, as the driver's frontend does, with the gateway when it is given
a key file. Ray Serve's proxy is not in the path.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from trtllm_kit.serve.frontend import start_frontend
from trtllm_kit.serve.ray.driver import RayFrontend, frontend_config, model_route

FRONTEND = "frontend"  # the ingress deployment's name
FRONTEND_RESOURCE = "kit_frontend"  # the head's custom resource: the frontend's replica runs there
ALL_INTERFACES = "0.0.0.0"  # the pod's network; the NetworkPolicy says who reaches it


class Ingress:
    """One replica of the frontend: the kit's OpenAI frontend on ``port``, in front of the model deployment.

    Arguments:
        model: the model deployment's handle; out: the artifact's path in the pod; name: the served name;
        port: the OpenAI port; api_keys, usage_log: the gateway's key file and usage log (None: no gateway).
    """

    def __init__(self, model: Any, out: str, name: str, port: int, api_keys: str | None = None,
                 usage_log: str | None = None) -> None:
        config = frontend_config(model_route(Path(out), name), Path(api_keys) if api_keys else None,
                                 Path(usage_log) if usage_log else None)
        self.started: asyncio.Task[web.AppRunner] = asyncio.get_running_loop().create_task(
            start_frontend(RayFrontend(config, model), ALL_INTERFACES, port))

    async def check_health(self) -> None:
        """Ray Serve's health check: healthy once the frontend listens; its failure to start, raised."""
        if self.started.done():
            self.started.result()
