"""LoRA adapters served by name, as vLLM serves them: a request's ``model`` may name an adapter of a served base
model, ``/v1/models`` lists each adapter with its ``parent`` and ``root``.

Each adapter has a task id, stable for as long as this frontend serves it (a new id when it is loaded again, so K/V
blocks computed under other weights are never reused). The first request of a task to ``tensorrt_llm`` carries the
adapter's rows, later ones only the id; when the backend answers that the task is not in its cache (it was
evicted), the request is sent once more with the rows, before any token reached the client, so an eviction is never
seen. llmapi models are sent the adapter's name (``lora_name``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.wire import GenerationRequest, GenerationResponse, LoraAdapter

NOT_CACHED = "not found in cache"  # the backend's "LoRA task <id> not found in cache. Please send LoRA weights ..."
Rows = tuple[np.ndarray, np.ndarray]  # lora_weights [N, W] float32, lora_config [N, 3]


@dataclass(eq=False)
class Adapter:
    """A served adapter: its name, the served model it adapts, where it came from, its task id and its rows."""

    name: str
    parent: str  # the served base model's name
    root: str  # the PEFT directory it was converted from
    task_id: int
    read_rows: Callable[[], Rows]
    uploads: Callable[[str], None]  # counts a request that carries the rows, by why ("first" or "evicted")
    is_recorded: bool = False  # recorded in the parent's artifact (else loaded while the frontend runs)
    is_sent: bool = False  # whether the server took its rows (as far as this frontend knows)
    _rows: Rows | None = field(default=None, repr=False)

    async def rows(self) -> Rows:
        """The rows, read (in a worker thread: reading and converting takes a while) by the first request that
        sends them."""
        if self._rows is None:
            self._rows = await asyncio.to_thread(self.read_rows)
        return self._rows

    async def adapter(self, client: TextClient, with_rows: bool) -> LoraAdapter:
        """The adapter as a request carries it: its name and task id, and its rows when they are to be sent and the
        model takes rows (an llmapi model takes the name alone)."""
        rows = await self.rows() if with_rows and await client.takes_lora_rows() else (None, None)
        return LoraAdapter(self.name, self.task_id, *rows)

    async def stream(self, client: TextClient, gen: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        """``client.stream`` of ``gen`` with this adapter: the rows on the task's first request, and again when the
        backend has evicted the task.

        Arguments:
            client: the base model's client; gen: the request.
        """
        with_rows = not self.is_sent
        if with_rows:
            self.uploads("first")
        started = False
        try:
            async for response in client.stream(replace(gen, lora=await self.adapter(client, with_rows))):
                started = self.is_sent = True
                yield response
            self.is_sent = True
            return
        except GenerationError as exc:
            if started or with_rows or NOT_CACHED not in str(exc):
                raise
        self.uploads("evicted")
        async for response in client.stream(replace(gen, lora=await self.adapter(client, True))):
            self.is_sent = True
            yield response


class AdapterSet:
    """The adapters a frontend serves, by name, with the next task id; counts the requests that carry rows.

    Arguments:
        registry: the frontend's Prometheus registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.adapters: dict[str, Adapter] = {}
        self.next_task_id = 1  # ids start at 1, as upstream's frontends number them
        self.counter = Counter("trtllm_kit_openai_lora_uploads", "Requests that carried an adapter's weights to "
                               "tensorrt_llm, by adapter and why (first use, or after an eviction).",
                               ("model", "reason"), registry=registry)

    def get(self, name: str) -> Adapter | None:
        return self.adapters.get(name)

    def add(self, name: str, parent: str, root: str, read_rows: Callable[[], Rows], *,
            is_recorded: bool = False) -> Adapter:
        """Serve a new adapter under ``name`` with the next task id.

        Arguments:
            name: its model name; parent: the served model it adapts; root: its source directory;
            read_rows: reads its ``lora_weights`` and ``lora_config`` rows; is_recorded: it comes from the
            parent's artifact.
        """
        if name in self.adapters:
            raise KitUsageError(f"an adapter named {name!r} is served already (of {self.adapters[name].parent!r}); "
                                "adapters of the served models need distinct names.")
        adapter = Adapter(name, parent, root, self.next_task_id, read_rows,
                          lambda reason: self.counter.labels(name, reason).inc(), is_recorded)
        self.next_task_id += 1
        self.adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> Adapter:
        """Stop serving the adapter ``name`` (requests running with it finish)."""
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise LookupError(name)
        return adapter

    def cards(self, created: int, max_model_len: Callable[[str], int | None]) -> list[dict[str, Any]]:
        """The ``/v1/models`` entries of the adapters, as vLLM lists them (``parent``: the base, ``root``: the
        adapter's directory).

        Arguments:
            created: the frontend's start time; max_model_len: the limit of a served base model.
        """
        return [{"id": a.name, "object": "model", "created": created, "owned_by": "trtllm-kit", "root": a.root,
                 "parent": a.parent, "max_model_len": max_model_len(a.parent)} for a in self.adapters.values()]
