"""``serve --disagg``: the CPU's two tritonservers, or with ``--server trtllm-serve`` upstream's workers and
orchestrator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trtllm_kit.serve.disagg.cpu import serve_disaggregated_cpu
from trtllm_kit.serve.disagg.trtllm_serve import serve_disaggregated_trtllm
from trtllm_kit.serve.options import ServeOptions


def serve_disaggregated(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Serve OUT disaggregated until SIGINT/SIGTERM.

    Arguments:
        options: the serve (``--disagg``); on_ready: called once with the state when every role answers.
    """
    if options.settings.server == "trtllm-serve":
        serve_disaggregated_trtllm(options, on_ready)
    else:
        serve_disaggregated_cpu(options, on_ready)
