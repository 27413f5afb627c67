"""The frontend's routing table: served name → the Triton models behind it, and A/B aliases over those names.

A route owns its client, tokenizer and limits, and counts its requests in flight so that a reload can wait for
them before it unloads the route's models. An alias sends each request to one of its models by the stated
shares: by a stable hash of the OpenAI ``user`` field when there is one (the same user always lands on the same
model), at random otherwise. A LoRA adapter's name resolves to a view of its base model's route that runs with it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, fields
from pathlib import Path

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.client import TOKEN_MODEL, TextClient
from trtllm_kit.serve.disagg.two_step_client import TwoStepClient
from trtllm_kit.serve.openai.adapters import Adapter, AdapterSet
from trtllm_kit.serve.openai.bls_client import BlsClient
from trtllm_kit.serve.openai.text import Tokenizer
from trtllm_kit.wire import GenerationRequest, GenerationResponse


@dataclass(eq=False)
class Route:
    """One served model: its name, version, Triton models, tokenizer and limits; requests in flight."""

    name: str
    triton_model: str  # the text model (BLS or ensemble), or the llmapi model
    token_model: str = TOKEN_MODEL  # where token-id prompts go
    tokenizer_dir: Path | None = None
    max_seq_len: int | None = None
    version: int = 1
    models: tuple[str, ...] = ()  # every Triton model the route uses (what a reload unloads)
    out: Path | None = None
    tokenizer: Tokenizer | None = None
    client: TextClient | None = None
    in_flight: int = 0
    # an engine artifact: whether it was built with ``[build] context_logits`` (prompt logprobs are computed from
    # them); None: the model scores prompts itself (cpu, llmapi)
    context_logits: bool | None = None
    adapter: Adapter | None = None  # the LoRA adapter this view of a base model's route runs with
    context_grpc_url: str | None = None  # a disaggregated serve's context server (``disagg/two_step_client.py``)
    max_batch_size: int | None = None  # sequences the engine runs at once (None: not stated)
    # ``bls_route.bls_num_draft_tokens``: text goes to the BLS with this many draft tokens (None: the direct route)
    num_draft_tokens: int | None = None

    @property
    def fingerprint(self) -> str:
        """OpenAI's ``system_fingerprint``: the served name and version."""
        return f"{self.name}-v{self.version}"

    @property
    def tokenizes(self) -> bool:
        """Whether the frontend tokenizes text prompts and streams them as ids from the token model (which the
        route's repository must hold), decoding the answer itself; not when it speculates through the BLS."""
        return self.tokenizer is not None and self.token_model in self.models and self.num_draft_tokens is None

    def open(self, grpc_url: str, headers: tuple[tuple[str, str], ...]) -> None:
        """Create the route's Triton client (inside the running event loop)."""
        if self.context_grpc_url is not None:
            self.client = TwoStepClient(grpc_url, self.context_grpc_url, self.triton_model, headers,
                                        token_model=self.token_model)
        elif self.num_draft_tokens is not None:
            self.client = BlsClient(grpc_url, self.triton_model, headers, token_model=self.token_model,
                                    num_draft_tokens=self.num_draft_tokens, tokenizer=self.tokenizer)
        else:
            self.client = TextClient(grpc_url, self.triton_model, headers, token_model=self.token_model)

    def stream(self, gen: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        """The client's stream of ``gen``, with the route's adapter when it has one."""
        assert self.client is not None, "the application is not started"
        return self.client.stream(gen) if self.adapter is None else self.adapter.stream(self.client, gen)

    def load_tokenizer(self) -> None:
        """Load the tokenizer from ``tokenizer_dir`` (once)."""
        if self.tokenizer is None and self.tokenizer_dir is not None:
            self.tokenizer = Tokenizer(self.tokenizer_dir)


class AdapterView(Route):
    """A base model's route named as one of its adapters and running with it; its requests in flight are the
    base's, so that a reload of the base waits for them too."""

    def __init__(self, base: Route, adapter: Adapter) -> None:
        self.base = base
        values = {f.name: getattr(base, f.name) for f in fields(base)}
        super().__init__(**{**values, "name": adapter.name, "adapter": adapter})

    @property
    def in_flight(self) -> int:
        return self.base.in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self.base.in_flight = value


@dataclass(frozen=True)
class Alias:
    """``NAME=A:90,B:10``: requests for ``NAME`` go to ``A`` 90 % of the time and to ``B`` 10 %."""

    name: str
    shares: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, text: str) -> Alias:
        """Read ``NAME=MODEL:WEIGHT,MODEL:WEIGHT...`` (weights are positive integers, any total).

        Arguments:
            text: the ``--alias`` value.
        """
        name, sep, rest = text.partition("=")
        shares: list[tuple[str, int]] = []
        for part in rest.split(",") if sep else []:
            model, colon, weight = part.strip().rpartition(":")
            if not colon or not model or not weight.isdigit() or int(weight) <= 0:
                shares = []
                break
            shares.append((model, int(weight)))
        if not name.strip() or len(shares) < 2 or len({m for m, _ in shares}) < len(shares):
            raise KitUsageError(f"--alias {text!r} is not NAME=MODEL:WEIGHT,MODEL:WEIGHT with two or more distinct "
                                "models and positive integer weights; e.g. --alias chat=a:90,b:10.")
        return cls(name.strip(), tuple(shares))

    @property
    def split(self) -> str:
        """The split as the response header shows it: ``a:90,b:10``."""
        return ",".join(f"{model}:{weight}" for model, weight in self.shares)

    def pick(self, user: str | None, rng: random.Random) -> str:
        """The model for one request: by a stable hash of ``user``, else at random.

        Arguments:
            user: the request's ``user`` field, or None; rng: the random source for requests without one.
        """
        total = sum(weight for _, weight in self.shares)
        if user:
            point = int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big") % total
        else:
            point = rng.randrange(total)
        for model, weight in self.shares:
            if point < weight:
                return model
            point -= weight
        raise AssertionError("the shares add up to the total")


@dataclass
class RouteTable:
    """Served names → routes, and aliases over them; swapping a route is one assignment."""

    routes: dict[str, Route] = field(default_factory=dict)
    aliases: dict[str, Alias] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    adapters: AdapterSet | None = None  # LoRA adapters of the served models, by name

    def add_alias(self, alias: Alias) -> None:
        """Add ``alias``, refusing one whose name is taken or whose models are not served."""
        check_aliases([*self.aliases.values(), alias], list(self.routes))
        self.aliases[alias.name] = alias

    @property
    def names(self) -> list[str]:
        """Every name a request may ask for: the served models, then the aliases."""
        return [*self.routes, *self.aliases]

    def resolve(self, model: str, user: str | None) -> tuple[Route, Alias | None]:
        """The route for a request's ``model`` (through an alias when it names one), and the alias.

        Arguments:
            model: the request's ``model``; user: its ``user`` field.
        """
        alias = self.aliases.get(model)
        if alias is not None:
            return self.routes[alias.pick(user, self.rng)], alias
        route = self.routes.get(model)
        if route is None:
            route = next((r for r in self.routes.values() if model in (r.triton_model,)), None)
        adapter = self.adapters.get(model) if route is None and self.adapters is not None else None
        if adapter is not None and adapter.parent in self.routes:
            route = AdapterView(self.routes[adapter.parent], adapter)
        if route is None:
            raise LookupError(model)
        return route, None


def check_aliases(aliases: list[Alias], served: list[str]) -> None:
    """Refuse aliases whose names are taken (by a served model or another alias) or whose models are not served.

    Arguments:
        aliases: the aliases; served: the served model names.
    """
    seen = set(served)
    for alias in aliases:
        if alias.name in seen:
            raise KitUsageError(f"--alias {alias.name} names a model that is already served; choose another name.")
        seen.add(alias.name)
        unknown = [m for m, _ in alias.shares if m not in served]
        if unknown:
            raise KitUsageError(f"--alias {alias.name} names {', '.join(unknown)}, which this server does not "
                                f"serve; it serves {', '.join(served)}.")
