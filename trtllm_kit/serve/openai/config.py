"""What the OpenAI frontend serves: where Triton is, the served names and their Triton models, the gateway's files.

A serve (``serve/service.py``) and a Kubernetes leader's frontend (``deploy/leader_frontend.py``) each make one from
what they started; it describes the frontend, not the serve (the serve's settings are ``serve/options.py``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.serve.openai.routes import Alias, Route, RouteTable


@dataclass(frozen=True)
class OpenAIConfig:
    """What the frontend serves: the Triton model behind it and the name clients use (one model), or ``routes``
    (several; the single-model fields are then unused) and A/B ``aliases`` over them."""

    grpc_url: str
    served_name: str
    triton_model: str = "ensemble"
    tokenizer_dir: Path | None = None
    api_key: str | None = None
    api_keys: Path | None = None  # the gateway's key file (keys, limits, quotas)
    usage_log: Path | None = None  # the gateway's usage log (default: beside the key file)
    max_seq_len: int | None = None  # prompt plus output tokens; requests beyond it are refused with a 400
    triton_headers: tuple[tuple[str, str], ...] = ()  # gRPC metadata Triton's restricted protocols demand
    routes: tuple[Route, ...] = ()
    aliases: tuple[Alias, ...] = ()

    def route_table(self) -> RouteTable:
        """The routes and aliases this configuration describes (one route from the single-model fields)."""
        routes = self.routes or (Route(self.served_name, self.triton_model, tokenizer_dir=self.tokenizer_dir,
                                       max_seq_len=self.max_seq_len),)
        table = RouteTable({route.name: route for route in routes})
        for alias in self.aliases:
            table.add_alias(alias)
        return table
