"""The worker's engine figures under the names a plain serve's Triton gives the same figures, so one dashboard reads
both: the CPU runtime's ``nv_trt_llm_*`` and ``trtllm_kit_batch_metrics`` gauges (``runtime/stats.py``, as the
Triton CPU model publishes them: requests active, waiting, scheduled; KV blocks max, free, used, reused, missed; the
step's tokens) and Triton's request counters ``nv_inference_request_success`` and ``nv_inference_request_failure``,
each labelled as the in-flight batching slot of a plain serve (``model="tensorrt_llm",version="1"``).

A worker appends them to its ``/metrics`` (``worker.py``); the serve's ``/metrics`` adds the ``worker`` label
(``worker_series.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_kit.names import TRTLLM_MODEL
from trtllm_kit.runtime.stats import GAUGES, ExecutorStats, gauge_values

SLOT_LABELS = (("model", TRTLLM_MODEL), ("version", "1"))  # the labels of a plain serve's engine model
SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"


@dataclass
class RequestCounts:
    """The worker's ``generate`` calls so far: ended with a finish reason, or refused, failed or cancelled."""

    success: int = 0
    failure: int = 0

    def count(self, ended: bool) -> None:
        """Count one request.

        Arguments:
            ended: whether it ended with a finish reason.
        """
        if ended:
            self.success += 1
        else:
            self.failure += 1


def _labels(extra: tuple[tuple[str, str], ...] = ()) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in (*SLOT_LABELS, *extra)) + "}"


def engine_exposition(stats: ExecutorStats, requests: RequestCounts) -> str:
    """The gauges and request counters as Prometheus text, in Triton's spelling (a counter's samples without
    ``_total``).

    Arguments:
        stats: the engine's counters now; requests: the worker's requests so far.
    """
    values = gauge_values(stats)
    lines = []
    for family, (label, fields) in GAUGES.items():
        lines += [f"# HELP {family} CPU runtime {label}", f"# TYPE {family} gauge"]
        lines += [f"{family}{_labels(((label, value),))} {values[field]!r}" for value, field in fields.items()]
    for family, count, what in ((SUCCESS, requests.success, "successful"), (FAILURE, requests.failure, "failed")):
        lines += [f"# HELP {family} Number of {what} inference requests, all batch sizes",
                  f"# TYPE {family} counter", f"{family}{_labels()} {float(count)!r}"]
    return "\n".join(lines) + "\n"
