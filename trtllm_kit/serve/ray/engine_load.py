"""What a replica's log says about its engine: a line per request when it ends (how, after how many tokens, its
prompt's prefix key) and a line whenever the engine's load changes (requests active and queued, KV cache blocks
free, prompt blocks reused from the cache and missed so far, steps run), read from ``LLM.get_stats``. Ray Serve
writes a replica's log under the Ray temp directory (``session_latest/logs/serve/replica_APP_DEPLOYMENT_ID.log``);
the tests and benchmarks read these lines there.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

SERVE_LOGGER = "ray.serve"  # what a replica logs on it goes to the replica's log file
LOAD_PERIOD_S = 0.25
REPLICA_LOGS = "session_latest/logs/serve/replica_*.log"  # under Ray's temp directory
ENDED = re.compile(r"request ended \((?P<how>finished|left|failed)\) after (?P<tokens>\d+) tokens, prefix "
                   r"(?P<prefix>\S+)")
LOAD = re.compile(r"engine load: (?P<active>\d+) active, (?P<queued>\d+) queued, (?P<free>\d+) of (?P<blocks>\d+) "
                  r"KV blocks free, (?P<reused>\d+) reused and (?P<missed>\d+) missed, step (?P<step>\d+)")
FIELDS = ("active", "queued", "free", "blocks", "reused", "missed", "step")


@dataclass(frozen=True)
class EngineLoad:
    """The engine's counters in one of ``LLM.get_stats``'s iteration records."""

    active: int
    queued: int
    free_blocks: int
    num_blocks: int
    reused_blocks: int  # prompt blocks found in the cache, since the engine started
    missed_blocks: int  # and full prompt blocks computed
    step: int

    @classmethod
    def of(cls, stats: dict[str, Any]) -> EngineLoad:
        """The load in an iteration record (the C++ executor's JSON keys).

        Arguments:
            stats: one record.
        """
        kv = stats.get("kvCacheStats") or {}
        return cls(int(stats.get("numActiveRequests", 0)), int(stats.get("numQueuedRequests", 0)),
                   int(kv.get("freeNumBlocks", 0)), int(kv.get("maxNumBlocks", 0)), int(kv.get("reusedBlocks", 0)),
                   int(kv.get("missedBlocks", 0)), int(stats.get("iter", 0)))

    @classmethod
    def parse(cls, line: str) -> EngineLoad | None:
        """The load a log line states, or None.

        Arguments:
            line: a line of a replica's log.
        """
        found = LOAD.search(line)
        return None if found is None else cls(*(int(found[name]) for name in FIELDS))

    def line(self) -> str:
        return (f"engine load: {self.active} active, {self.queued} queued, {self.free_blocks} of {self.num_blocks} "
                f"KV blocks free, {self.reused_blocks} reused and {self.missed_blocks} missed, step {self.step}")


def ended_line(how: str, num_tokens: int, prefix: str | None) -> str:
    """The line of a request that ended: ``finished``, ``left`` (its caller went) or ``failed``.

    Arguments:
        how: how it ended; num_tokens: tokens it received; prefix: its prompt's prefix key (``prefix.py``).
    """
    return f"request ended ({how}) after {num_tokens} tokens, prefix {prefix or '-'}"


async def watch_load(llm: Any, logger: logging.Logger) -> None:
    """Log the engine's load each time it changes (requests, free blocks), every ``LOAD_PERIOD_S``; runs until
    cancelled.

    Arguments:
        llm: the replica's ``LLM``; logger: the replica's logger.
    """
    last: EngineLoad | None = None
    while True:
        records = llm.get_stats(timeout=0)
        if records:
            load = EngineLoad.of(records[-1])
            if last is None or replace(load, step=last.step) != last:
                last = load
                logger.info(load.line())
        await asyncio.sleep(LOAD_PERIOD_S)


def replica_logs(ray_tmp: Path) -> dict[str, list[str]]:
    """Each replica's log lines, by the log's file name (one replica each, those Ray since replaced included).

    Arguments:
        ray_tmp: Ray's temp directory (``RUN_DIR/ray/tmp`` links to it).
    """
    return {path.name: path.read_text(errors="replace").splitlines() for path in sorted(ray_tmp.glob(REPLICA_LOGS))}
