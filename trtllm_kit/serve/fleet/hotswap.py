"""Hot reload inside a running serve: a new artifact loaded beside the old one, traffic switched, the old drained.

Steps, each bounded: check the new artifact is servable and fits next to what is served (refusing before
anything changes); copy its repository in as ``NAME__vN__*``; load those models through Triton's repository API
(explicit model control, with the per-launch token); switch the route, so every new request
goes to the new version; wait until the old route's requests in flight have finished; unload the old models
that no other route uses and delete their copies.

Reload is one feature in two modules: ``fleet/reload.py`` is its channel (the ``reload`` command's request file,
taken and answered here); this module is the swap the serve performs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from trtllm_kit.artifact.integrity import check_artifact
from trtllm_kit.artifact.manifest import ManifestError
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.fleet.fit import check_fit, memory_need
from trtllm_kit.serve.fleet.members import route, versioned
from trtllm_kit.serve.fleet.merge import copy_models, remove_models
from trtllm_kit.serve.fleet.reload import answer, take_requests
from trtllm_kit.serve.fleet.running import Server, drop_idle_ensemble
from trtllm_kit.serve.openai.adapter_admin import serve_recorded
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.servable import Servable, servable
from trtllm_kit.serve.server.launcher import http_headers
from trtllm_kit.serve.server.state import claim_run_dir, serving_pid, write_pid

DRAIN_TIMEOUT_S = 120.0  # in-flight requests of the old version get this long before it is unloaded
UNLOAD_TIMEOUT_S = 60.0
LOG = logging.getLogger(__name__)


class Reloader:
    """Answers reload requests of one serve, one at a time.

    Arguments:
        server: the running serve.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[None]] = set()
        self.run_dir = Path(server.state["run_dir"])

    def requested(self) -> None:
        """SIGUSR1: take the pending requests and answer them in the background."""
        task = asyncio.get_running_loop().create_task(self._answer_pending())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _answer_pending(self) -> None:
        async with self.lock:
            for request in take_requests(self.run_dir):
                try:
                    result = await self.reload(request["name"], Path(request["new_out"]),
                                               force=bool(request.get("force")))
                except (KitUsageError, ManifestError) as exc:  # refused before anything changed
                    result = {"error": str(exc), "refused": True}
                except Exception as exc:  # the serve keeps serving the old version; the caller gets the reason
                    LOG.exception("reload of %s failed", request.get("name"))
                    result = {"error": f"the reload failed: {exc}", "refused": False}
                answer(self.run_dir, request["id"], result)

    async def reload(self, name: str, new_out: Path, *, force: bool = False) -> dict[str, Any]:
        """Serve ``new_out`` as the next version of ``name``; return what happened (times in seconds).

        Arguments:
            name: a served model name; new_out: the new build output; force: serve it even when its model family,
            tokenizer or target differs from the served version's.
        """
        server, started = self.server, time.perf_counter()
        frontend, launch = server.frontend, server.launch
        if frontend is None:
            raise KitUsageError("reload switches the OpenAI frontend's routes, and this serve has none; serve with "
                                "--openai-port PORT.")
        if launch.world_size > 1:
            raise KitUsageError(f"reload needs a single-process server, and this one runs {launch.world_size} "
                                "ranks; restart it with the new OUT instead.")
        names = [r.name for r in server.routes]
        if name not in names:
            raise KitUsageError(f"no served model is named {name!r}; this server serves {', '.join(names)}.")
        index = names.index(name)
        old = server.routes[index]
        holder = serving_pid(new_out)
        if holder is not None and holder != os.getpid():
            raise KitUsageError(f"{new_out} is served by another trtllm-kit serve (pid {holder}); stop it first.")
        target = servable(new_out)
        differences = [] if force else unlike(server.members[index].target, target)
        if differences:
            raise KitUsageError(f"{new_out} is not a new version of {name}: {'; '.join(differences)}; pass --force "
                                "to serve it under this name anyway.")
        check_artifact(target.artifact, hashes=server.options.settings.verify)
        wanted = server.options.settings.model
        text_model = wanted if wanted in target.models else target.models[0]
        member = versioned(name, target, old.version + 1)
        others = [memory_need(m.name, m.target) for i, m in enumerate(server.members) if i != index]
        need = memory_need(f"{name} v{member.version}", target)
        check_fit([*(others if need.on_gpu else []), need], what=f"{new_out} next to the served models")
        copied = copy_models(target.repo, launch.repo, member.prefix)
        new = drop_idle_ensemble(route(member, copied, text_model), copied, launch.repo,
                                 server.options.settings.ensemble)
        loaded: list[str] = []
        headers = http_headers(launch.restricted_token)  # the repository API demands the per-launch token
        async with aiohttp.ClientSession(f"http://{launch.endpoints.url('http')}", headers=headers) as http:
            try:
                for model in _load_order(list(new.models)):
                    if model not in await _ready(http):  # an ensemble's load brings its steps (reloading a ready
                        await _post(http, f"/v2/repository/models/{model}/load")  # one would replace it)
                    loaded.append(model)
                await asyncio.get_running_loop().run_in_executor(None, new.load_tokenizer)
                new.open(launch.endpoints.url("grpc"), frontend.config.triton_headers)
                if frontend.table.adapters is not None:  # the new version's adapters, with new task ids
                    serve_recorded(frontend.table.adapters, frontend.table, [new])
            except BaseException:
                for model in reversed(loaded):
                    with contextlib.suppress(Exception):
                        await _post(http, f"/v2/repository/models/{model}/unload")
                remove_models(launch.repo, list(copied.names.values()))
                raise
            watch = server.watch
            watch.stubs.update({pid: m for pid, m in watch.process.stubs().items() if m in loaded})
            loaded_s = time.perf_counter() - started
            in_flight = old.in_flight
            frontend.table.routes[name] = new  # every request from now on goes to the new version
            server.routes[index], server.members[index] = new, member
            switched_s = time.perf_counter() - started
            drained = await _drain(old, DRAIN_TIMEOUT_S)
            in_use = {m for r in frontend.table.routes.values() for m in r.models}
            retired = [m for m in reversed(old.models) if m not in in_use]
            watch.stubs = {pid: m for pid, m in watch.stubs.items() if m not in retired}
            for model in retired:
                await _post(http, f"/v2/repository/models/{model}/unload")
            await _wait_unloaded(http, retired, UNLOAD_TIMEOUT_S)
        remove_models(launch.repo, retired)
        if old.client is not None:
            await old.client.close()
        claim_run_dir(new_out)
        write_pid(new_out)  # a rebuild into the new OUT is refused while it is served
        outs = server.state["outs"]
        if str(new_out.absolute()) not in outs:
            outs.append(str(new_out.absolute()))
        server.write_state()
        return {"name": name, "old_version": old.version, "version": new.version, "old_models": list(old.models),
                "models": list(new.models), "unloaded": retired, "in_flight_at_switch": in_flight,
                "drained": drained, "load_s": round(loaded_s, 3), "switch_s": round(switched_s, 3),
                "total_s": round(time.perf_counter() - started, 3), "out": str(new_out.absolute())}


async def _post(http: aiohttp.ClientSession, path: str, body: dict[str, Any] | None = None) -> Any:
    """POST to Triton's HTTP API; raise ``KitError`` with Triton's message on failure."""
    async with http.post(path, json=body or {}, timeout=aiohttp.ClientTimeout(total=600)) as response:
        text = await response.text()
        if response.status != 200:
            raise KitError(f"Triton refused {path} ({response.status}): {text.strip()}")
        return await response.json(content_type=None) if text.strip() else None


def unlike(old: Servable, new: Servable) -> list[str]:
    """How ``new`` differs from ``old`` in what its clients see: model family, tokenizer files or target.

    Arguments:
        old: the served version; new: the candidate.
    """
    found = []
    if old.artifact.target != new.artifact.target:
        found.append(f"its target is {new.artifact.target}, the served one's {old.artifact.target}")
    families = [a.records.model.family if a.records.model else None for a in (old.artifact, new.artifact)]
    if families[0] != families[1]:
        found.append(f"its model family is {families[1]}, the served one's {families[0]}")
    if _tokenizer_files(old) != _tokenizer_files(new):
        found.append("its tokenizer files differ from the served one's")
    return found


def _tokenizer_files(target: Servable) -> dict[str, str]:
    """The tokenizer's files and their sha256, as the manifest records them."""
    return {path: digest for path, digest in target.artifact.files.items() if path.startswith("tokenizer/")}


def _load_order(models: list[str]) -> list[str]:
    """Ensembles first (Triton loads their steps with them), then the rest in ``models``' order."""
    return sorted(models, key=lambda m: not m.endswith("ensemble"))


async def _ready(http: aiohttp.ClientSession) -> set[str]:
    """The models Triton's repository index shows ready."""
    return {e.get("name") for e in await _post(http, "/v2/repository/index") or [] if e.get("state") == "READY"}


async def _drain(old: Route, timeout_s: float) -> bool:
    """Wait until the old route has no request in flight (at most ``timeout_s``); whether it drained."""
    deadline = time.monotonic() + timeout_s
    while old.in_flight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return old.in_flight == 0


async def _wait_unloaded(http: aiohttp.ClientSession, models: list[str], timeout_s: float) -> None:
    """Wait until Triton's repository index shows none of ``models`` ready (at most ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and set(models) & await _ready(http):
        await asyncio.sleep(0.05)
