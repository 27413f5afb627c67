"""Which adapters a frontend serves: those recorded in each served artifact (``trtllm-kit lora add``), and those
loaded and unloaded while it runs through vLLM's ``POST /v1/load_lora_adapter`` {lora_name, lora_path} and
``POST /v1/unload_lora_adapter`` {lora_name}. A loaded adapter is checked and converted exactly as ``lora add`` does
it, in memory (the artifact is not changed), its files read as ``lora.adapter_files`` bounds them; an adapter
whose recorded base model is not the served one is refused unless the body says ``"force": true``. With gateway
keys, only an admin key may load or unload."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

from aiohttp import web

from trtllm_kit.artifact import Artifact
from trtllm_kit.errors import KitUsageError
from trtllm_kit.lora.store import base_sizes, check_adapter, check_name
from trtllm_kit.serve.http.body import json_body
from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.http.exchange import CALLER
from trtllm_kit.serve.openai.adapters import AdapterSet, Rows
from trtllm_kit.serve.openai.routes import Route, RouteTable

LOAD_PATH, UNLOAD_PATH = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
MAX_PATH_CHARS = 4096  # PATH_MAX: the longest path Linux opens


def serve_recorded(adapters: AdapterSet, table: RouteTable, routes: list[Route] | None = None) -> None:
    """Serve the adapters recorded in each route's artifact, in name order, under their names, in place of those
    of an earlier version of the route (a reload): with new task ids, so the backend never keeps their old weights.

    Arguments:
        adapters: the frontend's adapters; table: the served models and aliases; routes: the routes whose
        artifacts to read (default: all).
    """
    for route in routes if routes is not None else list(table.routes.values()):
        out = route.out
        if out is None:  # served without its artifact (a deployment's leader): no recorded adapters
            continue
        records = sorted(Artifact.read(out).records.adapters.items())
        for name, _ in records:
            if name in table.names:
                raise KitUsageError(f"{out} has an adapter named {name!r}, which is also a served model or "
                                    "alias; serve the model under another name (--name NAME=OUT).")
        for old in [a for a in adapters.adapters.values() if a.parent == route.name and a.is_recorded]:
            adapters.remove(old.name)
        for name, record in records:
            adapters.add(name, route.name, record.source, partial(_file_rows, out, record.dir, record.rank),
                         is_recorded=True)


def _file_rows(out: Path, adapter_dir: str, rank: int) -> Rows:
    """The backend's rows of an adapter stored in an artifact: an engine's ``.npy`` files as they are, a cpu
    artifact's converted pairs made into rows; each file read within the bounds of an adapter of its rank."""
    import io

    import numpy as np
    import torch

    from trtllm_kit.lora.adapter_files import read_rows, weights_bound
    from trtllm_kit.lora.formats import ENGINE_CONFIG, ENGINE_WEIGHTS
    from trtllm_kit.runtime.lora import ADAPTER_FILE, load_adapter, to_rows

    where, bound = out / adapter_dir, weights_bound(base_sizes(out), rank)
    if (where / ENGINE_WEIGHTS).is_file():
        weights = np.load(io.BytesIO(read_rows(where / ENGINE_WEIGHTS, bound)))
        config = np.load(io.BytesIO(read_rows(where / ENGINE_CONFIG, bound)))
        return weights[0], config[0]
    rows, keys = to_rows(load_adapter(where / ADAPTER_FILE, torch.float32, bound.file_bytes))
    return rows.numpy(), keys.numpy()


def _converted_rows(artifact: Artifact, source: Path, force: bool) -> Rows:
    """The rows of the PEFT adapter at ``source``, checked against ``artifact`` and converted as ``lora add`` does."""
    import torch

    from trtllm_kit.runtime.lora import to_rows

    weights, config = to_rows(check_adapter(artifact, source, force=force).converted(torch.float32))
    return weights.numpy(), config.numpy()


class AdapterAdmin:
    """The load and unload endpoints of one frontend.

    Arguments:
        table: the frontend's routes (with its adapters); has_keys: whether gateway keys are on (then only an
        admin key may call these endpoints).
    """

    def __init__(self, table: RouteTable, adapters: AdapterSet, has_keys: bool) -> None:
        self.table, self.adapters, self.has_keys = table, adapters, has_keys

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(LOAD_PATH, self.load)
        app.router.add_post(UNLOAD_PATH, self.unload)

    def _check_admin(self, request: web.Request) -> None:
        record = request.get(CALLER)
        if self.has_keys and (record is None or not record.admin):
            name = record.name if record is not None else "?"
            raise HTTPError(f"the key {name!r} may not load or unload adapters; use a key made with trtllm-kit "
                            "keys add NAME --admin.", 403, code="admin_key_required", kind="permission_error")

    async def load(self, request: web.Request) -> web.Response:
        """Check, convert and serve the PEFT adapter at ``lora_path`` as ``lora_name`` (of ``base_model_name``,
        needed when the frontend serves several models; ``force``: take it whatever base model it records)."""
        self._check_admin(request)
        body = await json_body(request)
        name, path, force = body.get("lora_name"), body.get("lora_path"), body.get("force", False)
        if not isinstance(name, str) or not isinstance(path, str):
            raise HTTPError("load_lora_adapter needs 'lora_name' and 'lora_path' strings (the adapter's name and "
                            "its PEFT directory on the server).", param="lora_name" if not isinstance(
                                   name, str) else "lora_path")
        _check_path(path)
        if not isinstance(force, bool):
            raise HTTPError(f"force must be true or false, got {force!r:.40}.", param="force")
        try:
            check_name(name)
        except KitUsageError as exc:
            raise HTTPError(str(exc), param="lora_name") from None
        if name in self.table.names or self.adapters.get(name) is not None:
            raise HTTPError(f"The lora adapter {name!r} has already been loaded (or names a served model); unload "
                            "it first or choose another name.", param="lora_name")
        route = self._parent(body.get("base_model_name"))
        if route.out is None:
            raise HTTPError(f"{route.name!r} is served without its artifact; adapters cannot be checked against "
                            "it.")
        source, artifact = Path(path), Artifact.read(route.out)
        if artifact.target == "llmapi":
            raise HTTPError(f"{route.name!r} is an llmapi artifact, whose model reads its adapters from the "
                            f"artifact; add the adapter with trtllm-kit lora add {route.out} {name} DIR and start "
                            "the serve again.", param="lora_path")
        try:
            rows = await asyncio.to_thread(_converted_rows, artifact, source, force)
        except KitUsageError as exc:
            raise HTTPError(str(exc), param="lora_path") from None
        if self.adapters.get(name) is not None:  # loaded meanwhile by a concurrent request
            raise HTTPError(f"The lora adapter {name!r} has already been loaded.", param="lora_name")
        self.adapters.add(name, route.name, str(source.resolve()), lambda: rows)  # converted already
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        """Stop serving the adapter ``lora_name``; requests running with it finish."""
        self._check_admin(request)
        name = (await json_body(request)).get("lora_name")
        if not isinstance(name, str):
            raise HTTPError("unload_lora_adapter needs a 'lora_name' string.", param="lora_name")
        try:
            self.adapters.remove(name)
        except LookupError:
            served = ", ".join(repr(n) for n in self.adapters.adapters) or "none"
            raise HTTPError(f"The lora adapter {name!r} is not loaded (loaded: {served}).", 404,
                            param="lora_name", code="model_not_found") from None
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def _parent(self, base: object) -> Route:
        routes = self.table.routes
        if base is None and len(routes) == 1:
            return next(iter(routes.values()))
        if not isinstance(base, str) or base not in routes:
            raise HTTPError(f"base_model_name must name one of the served models ({', '.join(routes)}), got "
                            f"{base!r:.80}.", param="base_model_name")
        return routes[base]



def _check_path(path: str) -> None:
    """Refuse a ``lora_path`` no file system opens: longer than ``MAX_PATH_CHARS`` or holding a NUL."""
    if len(path) > MAX_PATH_CHARS:
        raise HTTPError(f"lora_path is {len(path)} characters, above the bound of {MAX_PATH_CHARS} (the longest "
                        "path Linux opens); pass the adapter directory's path.", param="lora_path")
    if "\0" in path:
        raise HTTPError("lora_path holds a NUL character, which no path can; pass the adapter directory's path.",
                        param="lora_path")
