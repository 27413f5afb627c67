"""A running serve: the processes it watches and what it serves (the state a reload changes and writes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.serve.fleet.members import Member
from trtllm_kit.serve.fleet.merge import Copied, remove_models
from trtllm_kit.serve.frontend import OpenAIFrontend
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.serve.server.launcher import LaunchConfig
from trtllm_kit.serve.server.state import write_state
from trtllm_kit.serve.server.watch import Watch


def route_state(route: Route) -> dict[str, Any]:
    """A route as ``state.json`` records it.

    Arguments:
        route: a served route.
    """
    return {"name": route.name, "version": route.version, "triton_model": route.triton_model,
            "models": list(route.models), "out": str(route.out.absolute()) if route.out else None}


def drop_idle_ensemble(route: Route, copied: Copied, repo: Path, keep: bool) -> Route:
    """Leave the ensemble out of the models ``route`` loads (and its copy out of the working repository), unless it
    is the route's text model or ``keep`` (``--ensemble``): Triton passes no cancellation into an ensemble, so a
    client that leaves one still has its request run to ``max_tokens``.

    Arguments:
        route: a route as ``members.route`` made it; copied: its models in the working repository ``repo``;
        keep: load the ensemble anyway.
    """
    ensemble = copied.names.get("ensemble")
    if ensemble is not None and not keep and route.triton_model != ensemble:
        route.models = tuple(m for m in route.models if m != ensemble)
        remove_models(repo, [ensemble])
    return route


@dataclass
class Server:
    """A running serve: its options, launch, watch, frontend and what it serves (what a reload changes)."""

    options: ServeOptions
    launch: LaunchConfig
    watch: Watch
    frontend: OpenAIFrontend | None
    members: list[Member]
    routes: list[Route]
    state: dict[str, Any]

    def write_state(self) -> None:
        """Write the state into every served OUT's run directory."""
        self.state["routes"] = [route_state(r) for r in self.routes]
        self.state["stubs"] = {str(pid): name for pid, name in self.watch.stubs.items()}
        write_state([Path(out) for out in self.state["outs"]], self.state)
