"""One serve as a value: the OUTs it serves, the ``[serve]`` settings, and what only a command line gives.

The settings are ``spec.ServeSettings``, declared once (flag, TOML key, default, help); this module adds what is
not a setting of the ``[serve]`` table: the OUTs (``--name NAME=OUT`` adds OUTs too), the A/B aliases and the
API key (read from the environment or its flag, never from a file). ``serve --detach`` hands the same serve to its
background process as the command line ``command_line`` writes from the declarations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_kit.defaults import DEFAULT_GRPC_PORT, DEFAULT_HOST, DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT
from trtllm_kit.errors import KitUsageError
from trtllm_kit.option import declared
from trtllm_kit.spec import ServeSettings


@dataclass(frozen=True)
class Endpoints:
    """Where the server listens: one bind address and the HTTP, gRPC and metrics ports."""

    host: str = DEFAULT_HOST
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT

    @property
    def client_host(self) -> str:
        """The address a local client connects to (a wildcard bind is reached over loopback)."""
        return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)

    def ports(self) -> dict[str, int]:
        return {"HTTP": self.http_port, "gRPC": self.grpc_port, "metrics": self.metrics_port}

    def url(self, kind: str) -> str:
        """``host:port`` for ``kind`` in ``http``, ``grpc``, ``metrics`` (IPv6 hosts bracketed)."""
        host = f"[{self.client_host}]" if ":" in self.client_host else self.client_host
        return f"{host}:{getattr(self, f'{kind}_port')}"


@dataclass(frozen=True)
class ServeOptions:
    """``trtllm-kit serve`` as a value: what to serve, and the settings it is served with."""

    out: Path
    settings: ServeSettings = field(default_factory=ServeSettings)
    api_key: str | None = field(default=None, repr=False)
    more: tuple[Path, ...] = ()  # further OUTs served beside ``out``
    names: tuple[str, ...] = ()  # ``--name NAME=OUT``
    aliases: tuple[str, ...] = ()  # ``--alias NAME=A:90,B:10``

    @property
    def endpoints(self) -> Endpoints:
        """Where Triton listens (the settings' host and ports)."""
        return Endpoints(**self.settings.endpoint_values())

    @property
    def outs(self) -> list[Path]:
        """Every OUT to serve: ``out``, ``more``, then those only ``--name`` gives, without repeats."""
        outs: list[Path] = []
        for out in (self.out, *self.more, *parse_names(self.names).values()):
            if all(os.path.realpath(out) != os.path.realpath(seen) for seen in outs):
                outs.append(out)
        return outs

    def command_line(self) -> list[str]:
        """The ``trtllm-kit serve`` arguments that describe this serve (every setting that differs from its
        default, paths made absolute); the API key is left out (it goes through ``API_KEY_ENV``)."""
        args = [str(self.out)]
        for d in declared(ServeSettings, "serve"):
            value = getattr(self.settings, d.name)
            if value == d.default or value is None or d.option.flag is None:
                continue
            if d.kind is bool:
                args.append(d.option.flag)
                continue
            args += [d.option.flag, str(value.absolute() if isinstance(value, Path) else value)]
        args += [str(out) for out in self.more]
        args += [arg for name in self.names for arg in ("--name", name)]
        args += [arg for alias in self.aliases for arg in ("--alias", alias)]
        return args


def parse_names(values: tuple[str, ...]) -> dict[str, Path]:
    """``--name NAME=OUT`` values as served name → output directory.

    Arguments:
        values: the flags' values.
    """
    names: dict[str, Path] = {}
    for value in values:
        name, sep, out = value.partition("=")
        if not sep or not name.strip() or not out.strip():
            raise KitUsageError(f"--name {value!r} is not NAME=OUT; e.g. --name small=out-small/.")
        if name.strip() in names:
            raise KitUsageError(f"--name {name.strip()} is given twice; each served name must be distinct.")
        names[name.strip()] = Path(out.strip())
    return names

