"""The serve's ``/metrics`` on ``serve --dynamo``: the kit's frontend's series, Dynamo's frontend's, and every worker's
(its ``/metrics``, read at each scrape from the address in its ready file), each worker's samples labelled
``worker="worker-N"``, a family's samples from every source under one ``# HELP``/``# TYPE``.

A worker whose ``/metrics`` does not answer (it died, or was killed and not yet restarted) has no series at that
scrape, only ``trtllm_kit_dynamo_worker_up{worker="worker-N"} 0``: its counters are not carried over from an
earlier scrape, since nothing holds them any more, and Prometheus marks the series that stopped stale. A worker
started again under the same name starts its counters from 0, which Prometheus's ``rate`` reads as a reset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WORKER_LABEL = "worker"
UP = "trtllm_kit_dynamo_worker_up"
UP_HEADER = (f"# HELP {UP} Whether the worker's /metrics answered at this scrape (0: it died or did not answer; "
             "its series are left out).", f"# TYPE {UP} gauge")


@dataclass
class Family:
    """One family's ``# HELP``/``# TYPE`` lines (the first source's) and its sample lines from every source."""

    header: list[str] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)


def _name(line: str) -> str:
    """The metric name a sample line begins with."""
    end = len(line)
    for mark in ("{", " "):
        at = line.find(mark)
        if at != -1:
            end = min(end, at)
    return line[:end]


def labelled(line: str, worker: str) -> str:
    """A sample line with ``worker="WORKER"`` first among its labels.

    Arguments:
        line: a Prometheus text sample line; worker: the worker's name.
    """
    name = _name(line)
    rest = line[len(name):]
    label = f'{WORKER_LABEL}="{worker}"'
    if rest.startswith("{"):
        inner = rest[1:]
        return f"{name}{{{label}{'' if inner.startswith('}') else ','}{inner}"
    return f"{name}{{{label}}}{rest}"


def add_text(families: dict[str, Family], text: str, worker: str | None = None) -> None:
    """Add one source's exposition to ``families`` (in order of first appearance), its samples labelled with
    ``worker`` when given.

    Arguments:
        families: the families so far; text: Prometheus text; worker: the worker's name, None for a frontend.
    """
    current: str | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = parts[2]
                family = families.setdefault(current, Family())
                if not any(h.split(maxsplit=2)[1] == parts[1] for h in family.header):
                    family.header.append(line)
            continue
        name = _name(line)
        if current is None or not name.startswith(current):
            current = name  # a sample without a header of its own
        families.setdefault(current, Family()).samples.append(line if worker is None else labelled(line, worker))


def merged(frontends: list[str], workers: dict[str, str | None]) -> str:
    """One exposition of the frontends' texts as they are and each worker's labelled, with ``UP`` per worker.

    Arguments:
        frontends: the frontends' texts; workers: each worker's text, None where its ``/metrics`` did not answer.
    """
    families: dict[str, Family] = {}
    for text in frontends:
        add_text(families, text)
    for worker, read in workers.items():
        if read is not None:
            add_text(families, read, worker)
    lines = [line for family in families.values() for line in (*family.header, *family.samples)]
    if workers:
        lines += [*UP_HEADER, *(f'{UP}{{{WORKER_LABEL}="{w}"}} {float(t is not None)!r}' for w, t in workers.items())]
    return "\n".join(lines) + "\n"
