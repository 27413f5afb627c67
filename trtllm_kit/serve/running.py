"""A running serve: the processes it watches and what it serves (the state a reload changes and writes)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.serve.launcher import LaunchConfig
from trtllm_kit.serve.members import Member
from trtllm_kit.serve.process import TritonProcess
from trtllm_kit.serve.routes import Route
from trtllm_kit.serve.state import run_dir

if TYPE_CHECKING:
    from trtllm_kit.serve.openai import OpenAIFrontend
    from trtllm_kit.serve.service import ServeOptions


def route_state(route: Route) -> dict[str, Any]:
    """A route as ``state.json`` records it.

    Arguments:
        route: a served route.
    """
    return {"name": route.name, "version": route.version, "triton_model": route.triton_model,
            "models": list(route.models), "out": str(route.out.absolute()) if route.out else None}


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
        text = json.dumps(self.state, indent=2) + "\n"
        for out in self.state["outs"]:
            path = run_dir(Path(out)) / "state.json"
            path.with_suffix(".tmp").write_text(text)
            path.with_suffix(".tmp").replace(path)


@dataclass
class Watch:
    """What a serving process checks every ``WATCH_S``: tritonserver and the stubs it had when it was ready (a
    reload adds the new version's stubs and drops the old one's before unloading it)."""

    process: TritonProcess
    stubs: dict[int, str] = field(default_factory=dict)

    def failure(self) -> str | None:
        """Why the server cannot serve any more (a process died), or None; new shm regions are made private."""
        self.process.protect_shm()
        proc = self.process.proc
        if proc is not None and proc.poll() is not None:
            return f"tritonserver exited with code {proc.returncode} while serving"
        dead = {pid: name for pid, name in self.stubs.items() if pid not in self.process.stubs()}
        if dead:
            pid, name = next(iter(dead.items()))
            return f"the Python-backend stub of model {name} (pid {pid}) died while serving"
        return None
