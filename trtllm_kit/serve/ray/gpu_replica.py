"""The model deployment on GPUs: each replica runs the llmapi artifact's ``trtllm-serve`` on its placement group.

A replica's placement group is one bundle of ``{"GPU": 1, "CPU": 1}`` per rank (tp x pp), packed on one node
(``STRICT_PACK``); the replica's actor takes the first bundle's CPU, and the GPUs Ray reserved for the bundles
(``bundle_gpu_ids``) are trtllm-serve's ``CUDA_VISIBLE_DEVICES``. The replica starts the command the artifact
records (``server/trtllm_serve.py`` ``launch_argv``) on a free loopback port, in a process group of its own that
ends with the replica's process (``PR_SET_PDEATHSIG``) and is stopped when the replica is, and waits for its
``/health``. ``generate`` takes the frontend's ``GenerationRequest``, as the CPU replica (``replica.py``) does,
sends it to trtllm-serve's ``/v1/completions`` (token ids in) and yields the kit's ``GenerationResponse``s.
Without the GPUs a replica needs, ``gpu_problem`` says so in one sentence before anything starts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.http_probe import answers
from trtllm_kit.serve.server.group import ProcessGroup
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.serve.server.process import die_with_parent_thread
from trtllm_kit.serve.server.trtllm_serve import INSTALL_HINT, SERVER, launch_argv
from trtllm_kit.wire import GenerationRequest, GenerationResponse
from trtllm_kit.wire.openai_body import encode_openai_body
from trtllm_kit.wire.request import BEAM_WEIGHTS

GPU_BUNDLE = {"GPU": 1, "CPU": 1}  # one rank's share of a replica's placement group
PLACEMENT_STRATEGY = "STRICT_PACK"  # a replica's ranks on one node
LOOPBACK = "127.0.0.1"
COMPLETIONS = "/v1/completions"
READY_TIMEOUT_S = 600.0  # trtllm-serve loads the checkpoint onto the GPUs before /health answers
STOP_GRACE_S = 5.0


def deployment_options(tp_size: int, pp_size: int) -> dict[str, Any]:
    """Ray Serve's deployment options for a replica of tp x pp ranks: its placement group and its actor's share.

    Arguments:
        tp_size, pp_size: the artifact's tensor and pipeline parallel sizes.
    """
    return {"placement_group_bundles": [dict(GPU_BUNDLE) for _ in range(tp_size * pp_size)],
            "placement_group_strategy": PLACEMENT_STRATEGY, "ray_actor_options": {"num_cpus": 1, "num_gpus": 0}}


def artifact_parallel(out: Path) -> tuple[int, int]:
    """The llmapi artifact's (tp_size, pp_size), as its checkpoint records them.

    Arguments:
        out: the artifact.
    """
    checkpoint = Artifact.read(out).records.checkpoint
    return (checkpoint.tp_size, checkpoint.pp_size) if checkpoint is not None else (1, 1)


def gpu_problem(out: Path, machine: Machine) -> str | None:
    """Why OUT's replicas cannot run trtllm-serve on this machine's GPUs (one sentence), or None.

    Arguments:
        out: the artifact; machine: ``detect_machine()``.
    """
    target = Artifact.read(out).target
    if target != "llmapi":
        return (f"--gpu-replicas runs trtllm-serve, and {out} is a target {target} artifact; build it with --target "
                "llmapi, or leave --gpu-replicas out to serve it on the CPU runtime.")
    tp_size, pp_size = artifact_parallel(out)
    if len(machine.gpus) < tp_size * pp_size:
        return (f"--gpu-replicas needs {tp_size * pp_size} GPU(s) per replica (tp {tp_size} x pp {pp_size}) and "
                f"this machine has {len(machine.gpus)} visible; run it where the GPUs are, or leave --gpu-replicas "
                "out to serve on the CPU runtime.")
    return None


def check_gpu_replicas(out: Path, machine: Machine) -> None:
    """Refuse ``--gpu-replicas`` for OUT on this machine, in ``gpu_problem``'s sentence, before anything starts.

    Arguments:
        out: the artifact; machine: ``detect_machine()``.
    """
    problem = gpu_problem(out, machine)
    if problem is not None:
        raise KitUsageError(problem)


def _gpu_ids() -> list[Any]:
    """In a task on one bundle: the GPUs Ray gave it."""
    import ray

    return list(ray.get_gpu_ids())


def bundle_gpu_ids() -> tuple[str, ...] | None:
    """The GPUs of this replica's placement group, one per bundle in bundle order; None outside a Ray worker or
    outside a placement group.

    A task taking one GPU is run on each bundle and reports the GPU Ray gave it; the bundles keep them reserved.
    """
    import ray
    from ray.util.placement_group import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():  # get_current_placement_group would start a Ray of its own
        return None
    group = get_current_placement_group()
    if group is None:
        return None
    probe = ray.remote(num_cpus=0, num_gpus=1)(_gpu_ids)
    calls = [probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, index)).remote()
             for index in range(group.bundle_count)]
    return tuple(str(gpu) for ids in ray.get(calls) for gpu in ids)


def server_environment(gpu_ids: tuple[str, ...] | None) -> dict[str, str]:
    """trtllm-serve's environment: this process's, with ``CUDA_VISIBLE_DEVICES`` the replica's GPUs when known.

    Arguments:
        gpu_ids: ``bundle_gpu_ids()``.
    """
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)} if gpu_ids else dict(os.environ)


def replica_argv(out: Path, port: int) -> list[str]:
    """The command a replica runs: the one ``serve --server trtllm-serve`` runs, on loopback ``port``.

    Arguments:
        out: the artifact; port: trtllm-serve's port.
    """
    return launch_argv(out, LOOPBACK, port)


def refusal(req: GenerationRequest) -> str | None:
    """The sentence refusing what a GPU replica does not carry to trtllm-serve for ``req``, or None.

    Arguments:
        req: the frontend's request.
    """
    if req.lora is not None:
        return f"the adapter {req.lora.name!r} is not served by --gpu-replicas; name the base model."
    if req.logprobs is not None or req.prompt_logprobs is not None:
        return (f"logprobs is {req.logprobs if req.logprobs is not None else req.prompt_logprobs}; --gpu-replicas "
                "returns no logprobs: leave logprobs (and echo) out.")
    if (req.n or 1) > 1 or req.best_of is not None or req.beam_width not in (None, 1):
        return (f"n is {req.n or 1}, best_of {req.best_of} and beam_width {req.beam_width}; --gpu-replicas answers "
                "one choice: send n=1 without best_of or beams.")
    for name in BEAM_WEIGHTS:  # they weigh beams only, which a replica does not run
        if getattr(req, name) is not None:
            return (f"{name} is {getattr(req, name)}; --gpu-replicas decode without beams, which it weighs: leave "
                    f"{name} out.")
    if req.guide is not None:
        return f"the guide {req.guide[0]!r} is not carried by --gpu-replicas; leave response_format out."
    return None


def completion_body(model: str, req: GenerationRequest) -> dict[str, Any]:
    """trtllm-serve's completion request for ``req`` (the wire's OpenAI body, stop strings included), streamed with
    the usage when ``req`` is. A token-id prompt asks for token ids back (``detokenize`` false: trtllm-serve then
    answers ``token_ids`` and no text), as the frontend reads a token-id answer.

    Arguments:
        model: the name trtllm-serve serves the model under; req: the frontend's request.
    """
    body = encode_openai_body(req, model, stream=bool(req.streaming))
    if isinstance(req.prompt, tuple):
        body["detokenize"] = False
    return body


def choice_response(event: dict[str, Any]) -> GenerationResponse:
    """A completion (or a streamed chunk of one) as the kit's response: its token ids when trtllm-serve returns
    them, its text, its finish reason and usage; an error event raises ``KitError`` with its message.

    Arguments:
        event: trtllm-serve's JSON.
    """
    if "error" in event or event.get("object") == "error":
        error = event.get("error", event)
        message = error.get("message", error) if isinstance(error, dict) else error
        raise KitError(f"{SERVER} refused the request: {message}")
    choices = event.get("choices") or []
    usage = event.get("usage") or {}
    token_ids = tuple(token for choice in choices for token in choice.get("token_ids") or ())
    return GenerationResponse(token_ids=token_ids, texts=tuple(choice.get("text") or "" for choice in choices),
                              num_input_tokens=usage.get("prompt_tokens"),
                              num_output_tokens=usage.get("completion_tokens"),
                              finish_reasons=tuple(choice.get("finish_reason") or "" for choice in choices
                                                   if choice.get("finish_reason")))


async def completion_responses(session: aiohttp.ClientSession, url: str,
                               body: dict[str, Any]) -> AsyncIterator[GenerationResponse]:
    """POST ``body`` to ``url`` and yield its completion, whole or chunk by chunk (server-sent events).

    Arguments:
        session: the HTTP session; url: trtllm-serve's ``/v1/completions``; body: ``completion_body``.
    """
    async with session.post(url, json=body) as answer:
        if answer.status != 200:
            error = KitUsageError if 400 <= answer.status < 500 else KitError  # a 4xx is the request's fault
            raise error(f"{SERVER} answered {answer.status} to {COMPLETIONS}: {(await answer.text())[:300]}")
        if not body["stream"]:
            yield choice_response(await answer.json())
            return
        async for line in answer.content:
            data = line.decode().strip().removeprefix("data:").strip()
            if not data or data == "[DONE]":
                continue
            yield choice_response(json.loads(data))


class GpuReplica:
    """One replica on GPUs: the artifact's trtllm-serve, started once on a free loopback port.

    Arguments:
        out: an llmapi artifact.
    """

    def __init__(self, out: str) -> None:
        self.session: aiohttp.ClientSession | None = None
        binary = shutil.which(SERVER)
        if binary is None:
            raise KitError(f"{SERVER} is not on PATH where the replica runs, so {out} cannot be served with "
                           f"--gpu-replicas; {INSTALL_HINT}.")
        self.port = free_port()
        argv = replica_argv(Path(out), self.port)
        self.model = argv[1]  # trtllm-serve names the model by the path it was given
        self.server = ProcessGroup(Path(tempfile.mkdtemp(prefix="trtllm-serve-")) / "trtllm-serve.log")
        self.server.start([binary, *argv[1:]], server_environment(bundle_gpu_ids()), prepare=die_with_parent_thread)
        not_ready = self.server.wait_ready(lambda: answers(f"http://{LOOPBACK}:{self.port}/health"),
                                           READY_TIMEOUT_S, poll_s=0.5, ports=(self.port,))
        if not_ready is not None:
            self.stop()
            raise KitError(f"{SERVER} was not ready on {LOOPBACK}:{self.port} (exit code {not_ready.exit_code}, log "
                           f"{self.server.log_path}); last lines:\n{self.server.log_tail()}")

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationResponse]:
        """Stream trtllm-serve's responses to ``req``; a caller that leaves closes the connection, which cancels it.

        Arguments:
            req: the frontend's request, as the CPU replica takes it.
        """
        refused = refusal(req)
        if refused is not None:
            raise KitUsageError(refused)  # the frontend answers 400 with it
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        url = f"http://{LOOPBACK}:{self.port}{COMPLETIONS}"
        async for response in completion_responses(self.session, url, completion_body(self.model, req)):
            yield response

    def stop(self) -> int | None:
        """Stop trtllm-serve's process group (SIGTERM, then SIGKILL after ``STOP_GRACE_S``); its exit code."""
        return self.server.stop(STOP_GRACE_S)

    def __del__(self) -> None:
        if getattr(self, "server", None) is not None:
            self.stop()
