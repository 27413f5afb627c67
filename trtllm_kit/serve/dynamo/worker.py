"""The kit's Dynamo worker: one artifact on the CPU runtime behind Dynamo's token-in, token-out endpoint.

``python -m trtllm_kit.serve.dynamo.worker OUT --card DIR --model-name NAME --endpoint NS.COMPONENT.generate
--ready-file PATH`` loads OUT (a cpu or llmapi artifact) into the kit's CPU ``LLM`` (``llmapi/cpu_llm.py``),
registers it with Dynamo's Python API (``ModelInput.Tokens``, chat and completions, the card directory of
``card.py`` as the model path, the artifact's KV block size), publishes the block manager's KV cache events for the
KV router (``kv_events.py``), adds its prefix-cache metrics to Dynamo's worker ``/metrics`` on a free loopback port
(``metrics.py``) with the engine's gauges and request counters under a plain serve's names (``engine_metrics.py``),
writes that address into the ready file and serves ``generate`` until SIGTERM. The model computes with the runtime's
default torch threads (``artifact_llm.py``). Discovery is Dynamo's file backend (``DYN_FILE_KV``) and requests
come over TCP: ``serve --dynamo`` sets both, and the loopback addresses (``launch.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.llmapi.cpu_llm import LLM, RequestError
from trtllm_kit.serve.artifact_llm import artifact_llm
from trtllm_kit.serve.dynamo.discovery import write_instance
from trtllm_kit.serve.dynamo.engine_metrics import RequestCounts, engine_exposition
from trtllm_kit.serve.dynamo.kv_events import EVENT_BUFFER, relay_events
from trtllm_kit.serve.dynamo.launch import LOOPBACK
from trtllm_kit.serve.dynamo.metrics import SYSTEM_PORT_ENV, exposition, system_port
from trtllm_kit.serve.dynamo.migration import Ledger, MigrationRefused, continuation
from trtllm_kit.serve.dynamo.request import WorkerRequest, prompt_scored, response_chunk, worker_request
from trtllm_kit.triton_models.llmapi_outputs import scored_of

DISCOVERY_BACKEND = "file"
REQUEST_PLANE = "tcp"
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """One worker: the artifact, its card directory, the served name, its endpoint, the file it touches once
    registered and the ledger of requests in flight it shares with the serve's other workers."""

    out: Path
    card: Path
    model_name: str
    endpoint: str
    ready_file: Path
    requests: Path


class Generator:
    """Dynamo's ``generate`` over the CPU ``LLM``: one streamed request per call, aborted when its client leaves.

    Arguments:
        llm: the loaded model; max_seq_len: its prompt + output bound;
        refusal: makes, from a sentence, the exception the frontend answers 400 with that sentence for (Dynamo's
        ``InvalidArgument``; its ``HttpError`` reaches the client as "Bad Request" alone);
        ledger: the requests in flight on the serve's workers, which tells a migrated request's generated tokens.
    """

    def __init__(self, llm: LLM, max_seq_len: int, refusal: Any, ledger: Ledger) -> None:
        self.llm, self.max_seq_len, self.refusal, self.ledger = llm, max_seq_len, refusal, ledger
        self.requests = RequestCounts()  # the worker's /metrics (``engine_metrics.py``)

    async def generate(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        """Stream the answer to one ``PreprocessedRequest`` as Dynamo's response chunks.

        Arguments:
            request: the frontend's request; context: Dynamo's request context (``id``, ``is_stopped``).
        """
        request_id = context.id()
        try:
            asked, num_prompt_tokens = self._continued(worker_request(request, self.max_seq_len), request_id)
            output = self.llm.generate_async(asked.token_ids, asked.sampling, streaming=True)
        except (KitUsageError, ValueError) as exc:
            self.ledger.end(request_id)
            self.requests.count(ended=False)
            if isinstance(exc, MigrationRefused):
                LOG.warning("request %s: %s", request_id, exc)
            raise self.refusal(str(exc)) from exc
        num_generated = len(asked.token_ids) - num_prompt_tokens  # by a worker that died
        sent, finished, ended, num_top = 0, False, False, asked.sampling.logprobs
        num_prompt_top = asked.sampling.prompt_logprobs  # the first chunk carries the prompt's logprobs
        try:
            async for result in output:
                completion = result.outputs[0]
                new_ids = completion.token_ids[sent:]
                scored = None if num_top is None else scored_of(completion.logprobs[sent:], new_ids, num_top)
                prompt = None if sent or num_prompt_top is None else \
                    prompt_scored(completion.prompt_logprobs, asked.token_ids, num_prompt_top)
                sent = len(completion.token_ids)
                finished = completion.finish_reason is not None
                if new_ids or finished:
                    yield response_chunk(new_ids, completion.finish_reason, num_prompt_tokens, num_generated + sent,
                                         scored, prompt)
                if context.is_stopped():
                    break
            ended = finished
        except RequestError as exc:
            finished = True
            raise self.refusal(str(exc)) from exc
        finally:
            self.ledger.end(request_id)
            self.requests.count(ended)
            if not finished:
                output.abort()

    def _continued(self, asked: WorkerRequest, request_id: str) -> tuple[WorkerRequest, int]:
        """The request as this worker runs it, and its original prompt length: a migrated one continued where its
        dead worker stopped (``migration.py``)."""
        num_prompt_tokens = self.ledger.begin(request_id, len(asked.token_ids))
        num_generated = len(asked.token_ids) - num_prompt_tokens
        if num_generated <= 0:
            return asked, len(asked.token_ids)
        return replace(asked, sampling=continuation(asked.sampling, num_generated)), num_prompt_tokens


async def run_worker(spec: WorkerSpec) -> None:
    """Load, register and serve until SIGTERM or SIGINT.

    Arguments:
        spec: the worker.
    """
    from dynamo.llm import KvEventPublisher, ModelInput, ModelType, WorkerType, register_model
    from dynamo.llm.exceptions import InvalidArgument
    from dynamo.runtime import DistributedRuntime

    llm, limits = artifact_llm(spec.out, event_buffer=EVENT_BUFFER)
    metrics_port = system_port(LOOPBACK)
    os.environ.update({"DYN_SYSTEM_HOST": LOOPBACK, SYSTEM_PORT_ENV: str(metrics_port)})  # read by the runtime
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, DISCOVERY_BACKEND, REQUEST_PLANE)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.shutdown)
    try:
        endpoint = runtime.endpoint(spec.endpoint)
        await register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, str(spec.card),
                             spec.model_name, worker_type=WorkerType.Aggregated,
                             kv_cache_block_size=limits.tokens_per_block)
        publisher = KvEventPublisher(endpoint, kv_block_size=limits.tokens_per_block)
        relay = asyncio.create_task(relay_events(llm, publisher))
        blocks = llm.engine.scheduler.block_manager
        generator = Generator(llm, limits.max_seq_len, InvalidArgument, Ledger(spec.requests))
        endpoint.metrics.register_prometheus_expfmt_callback(
            lambda: exposition(blocks, spec.model_name) + engine_exposition(llm.engine.stats(), generator.requests))
        write_instance(spec.ready_file, endpoint.connection_id())  # what the serve withdraws if this worker dies
        written = spec.ready_file.with_name(f"{spec.ready_file.name}.part")
        written.write_text(f"http://{LOOPBACK}:{metrics_port}/metrics\n")
        written.replace(spec.ready_file)  # whole, or not there yet
        await endpoint.serve_endpoint(generator.generate,
                                      graceful_shutdown=False)
        relay.cancel()
    finally:
        llm.shutdown()


def main(argv: list[str] | None = None) -> int:
    """The worker process: parse, run, exit 1 with one sentence on an expected failure.

    Arguments:
        argv: the arguments after the module name (``sys.argv[1:]`` when omitted).
    """
    parser = argparse.ArgumentParser(prog="python -m trtllm_kit.serve.dynamo.worker")
    parser.add_argument("out", type=Path)
    parser.add_argument("--card", type=Path, required=True)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--requests", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = WorkerSpec(out=args.out, card=args.card, model_name=args.model_name, endpoint=args.endpoint,
                      ready_file=args.ready_file, requests=args.requests)
    try:
        asyncio.run(run_worker(spec))
    except KitError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the model and Dynamo's runtime are released: skip seconds of interpreter finalisation on stop
