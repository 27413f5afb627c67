"""Per-request records: client timestamps of every streamed chunk, token counts and the server's own view.

All client times are ``time.monotonic_ns()``; server times (from ``return_perf_metrics``) are only compared
with each other. One record is one line of ``requests.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, ERROR = "ok", "error"
SPECULATIVE_COUNTS = ("drafts", "draft_tokens", "accepted_tokens")  # usage.speculative's counts, kept in ``server``


@dataclass
class RequestRecord:
    """What the client saw for one request. ``chunks`` holds ``[t_ns, n_tokens]`` per streamed response."""

    request_id: str
    isl: int
    osl_requested: int
    t_send_ns: int = 0
    t_end_ns: int = 0
    chunks: list[list[int]] = field(default_factory=list)
    status: str = OK
    error: str = ""
    error_kind: str = ""  # server, transport, timeout, cancel
    osl_server: int | None = None
    server: dict[str, int] = field(default_factory=dict)
    t_scheduled_ns: int | None = None  # open loop: when the request should have been sent
    scenario: str = ""
    level: str = ""
    repeat: int = 0

    def add_chunk(self, t_ns: int, n_tokens: int) -> None:
        """Record one streamed response that carried ``n_tokens`` new tokens.

        Arguments:
            t_ns: arrival time (monotonic ns).
            n_tokens: tokens in the response (0 for an empty response).
        """
        self.chunks.append([t_ns, n_tokens])

    def fail(self, kind: str, message: str) -> None:
        """Mark the request failed.

        Arguments:
            kind: error category (server, transport, timeout, cancel).
            message: the error text.
        """
        self.status, self.error_kind, self.error = ERROR, kind, message

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def osl_observed(self) -> int:
        return sum(n for _, n in self.chunks)

    @property
    def token_times_ns(self) -> list[tuple[int, int]]:
        """The non-empty chunks (empty ones are ignored for TTFT and ITL)."""
        return [(t, n) for t, n in self.chunks if n > 0]

    @property
    def is_length_mismatch(self) -> bool:
        return self.ok and self.osl_observed != self.osl_requested

    @property
    def is_server_count_mismatch(self) -> bool:
        return self.ok and self.osl_server is not None and self.osl_server != self.osl_observed

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["osl_observed"] = self.osl_observed
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> RequestRecord:
        row = {k: v for k, v in row.items() if k != "osl_observed"}
        return cls(**row)


def write_records(records: Iterable[RequestRecord], path: Path) -> int:
    """Append records as JSON lines; returns how many were written.

    Arguments:
        records: the records.
        path: the ``requests.jsonl`` file.
    """
    count = 0
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")
            count += 1
    return count


def read_records(path: Path) -> list[RequestRecord]:
    """Read a ``requests.jsonl`` file.

    Arguments:
        path: the file.
    """
    return [RequestRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
