"""``serve --dynamo`` with real Dynamo: its frontend and the kit's workers on this machine.

The greedy answer equals a plain serve's; a worker SIGKILLed mid-stream is replaced by another without the client
noticing (the stream equals the unfaulted one); stop, and a SIGKILL of serve, leave no process behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
from kit_server import BuildKey, Builds, KitServer, Servers

from trtllm_kit.serve.dynamo.discovery import instance_file
from trtllm_kit.serve.dynamo.launch import DynamoDirs, serve_net
from trtllm_kit.serve.dynamo.metrics import worker_metrics_urls
from trtllm_kit.serve.server.netns import pids_in
from trtllm_kit.serve.server.reaper import group_alive
from trtllm_kit.serve.server.state import SERVE_LOG

if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.llm") is None:
    pytest.skip("NVIDIA Dynamo is not installed (pip install -e '.[dynamo]' and the ai-dynamo wheel with --no-deps, "
                "as .ci/run does).", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LLMAPI = BuildKey.of(target="llmapi")
PROMPT_IDS = [1, 264, 333, 84, 534, 332]  # token ids: both frontends see the same prompt, BOS included
LONG_TOKENS = 500  # long enough that a worker dies mid-stream: a stream outruns its client by many chunks
KILL_AT_CHUNK = 100  # the chunk after which the worker generating a stream is killed
EOS_PROMPT_IDS = [1, 75, 613, 917, 149]  # the tiny model's greedy answer ends on its end token, 4 tokens in


def _stream(server: KitServer, model: str, max_tokens: int, on_chunk: Any = None,
            **extra: Any) -> tuple[str, str | None]:
    """A streamed greedy completion of PROMPT_IDS: its text and finish reason; ``on_chunk(n)`` after each chunk."""
    text, reason, errors = _stream_events(server, model, max_tokens, on_chunk, **extra)
    assert not errors, errors
    return text, reason


def _stream_events(server: KitServer, model: str, max_tokens: int, on_chunk: Any = None,
                   **extra: Any) -> tuple[str, str | None, list[str]]:
    """A streamed completion of PROMPT_IDS (greedy unless ``extra`` says otherwise): its text, finish reason and
    the error events' raw lines."""
    body = {"model": model, "prompt": PROMPT_IDS, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, **extra}
    request = urllib.request.Request(f"{server.url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    text, reason, chunks, errors = "", None, 0, []
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data:"))
            if "error" in event:
                errors.append(line)
                continue
            for choice in event.get("choices") or []:
                text += choice.get("text") or ""
                reason = choice.get("finish_reason") or reason
            chunks += 1
            if on_chunk is not None:
                on_chunk(chunks)
    return text, reason, errors


def _complete(server: KitServer, model: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT_IDS, "max_tokens": max_tokens, "temperature": 0}
    status, _, raw = server.post("/v1/completions", json.dumps(body).encode())
    assert status == 200, raw
    return json.loads(raw)


def _groups(state: dict[str, Any]) -> list[int]:
    """The process groups of a dynamo serve's frontend and workers (each leads its own)."""
    return [int(state["server_pid"]), *(int(w["pid"]) for w in state["workers"].values())]


def _worker_cpu_s(state: dict[str, Any]) -> dict[int, float]:
    """Each worker's CPU seconds so far, by pid; a worker an earlier kill left dead or a zombie is left out."""
    spent = {}
    for worker in state["workers"].values():
        try:
            spent[int(worker["pid"])] = sum(psutil.Process(int(worker["pid"])).cpu_times()[:2])
        except psutil.Error:
            continue
    return spent


def _wait_gone(pgids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(group_alive(g) for g in pgids):
        time.sleep(0.1)
    return [g for g in pgids if group_alive(g)]


def _wait_withdrawn(state: dict[str, Any], pids: list[int], timeout_s: float) -> list[int]:
    """Wait until the (dead) workers ``pids`` are out of the serve's discovery, where the router picks workers; the
    instance ids of theirs still listed after ``timeout_s``."""
    dirs = DynamoDirs(Path(state["run_dir"]) / "dynamo")
    ids = {int(instance_file(dirs.ready / name).read_text()) for name, w in state["workers"].items()
           if int(w["pid"]) in pids}

    def listed() -> list[int]:
        found = []
        for entry in (dirs.discovery / "v1" / "instances").iterdir():
            try:
                found.append(json.loads(entry.read_text())["instance_id"])
            except (OSError, ValueError, KeyError):
                continue  # being written or removed
        return sorted(ids.intersection(found))

    deadline = time.monotonic() + timeout_s
    while (left := listed()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def dynamo(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    out = kit_builds.copy(LLMAPI, tmp_path_factory.mktemp("dynamo") / "out")
    with KitServer(out, dynamo=True, workers=2, migration_limit=3) as server:
        yield server


def test_models_lists_the_artifact(dynamo: KitServer) -> None:
    with urllib.request.urlopen(f"{dynamo.url}/v1/models", timeout=30) as response:
        assert response.status == 200
        raw = response.read()
    assert [m["id"] for m in json.loads(raw)["data"]] == [dynamo.state["model"]]
    assert dynamo.state["server"] == "dynamo" and len(dynamo.state["workers"]) == 2


def _answers(address: str) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted from this thread's network namespace."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except ConnectionRefusedError:
        return False
    return True


def test_dynamo_s_ports_are_closed_outside_the_serve_s_network_namespace(dynamo: KitServer) -> None:
    root = Path(dynamo.state["run_dir"]) / "dynamo"
    private = [dynamo.state["dynamo_frontend"],
               *(urlsplit(url).netloc for url in worker_metrics_urls(root).values())]
    assert len(private) == 3
    assert _answers(f"127.0.0.1:{dynamo.port}")  # the public port
    assert [address for address in private if _answers(address)] == []
    net = serve_net(root)
    try:
        assert net.namespace == dynamo.state["net_namespace"]
        assert [address for address in private if not net.call(_answers, address)] == []  # they listen inside
    finally:
        net.close()


def test_greedy_answer_equals_a_plain_serve(dynamo: KitServer, kit_servers: Servers) -> None:
    plain = kit_servers.get(LLMAPI)
    model = dynamo.state["model"]
    ours, theirs = _complete(dynamo, model, 24), _complete(plain, model, 24)
    assert ours["usage"]["completion_tokens"] == theirs["usage"]["completion_tokens"]
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert ours["choices"][0]["text"]


LOGPROB_ATOL = 1e-5  # the plain serve's logprob tests' tolerance
FLOAT32_REL = 1e-5  # float32 sums of another order: a few units of its 1.2e-7 epsilon, times the layers


Scored = tuple[str, float, list[tuple[str, float]], int | None]


def _scored(server: KitServer, model: str, chat: bool, stream: bool, num_top: int, max_tokens: int = 12,
            on_chunk: Any = None) -> list[Scored]:
    """A greedy answer's logprobs as the ``openai`` client parses them: per token its string, logprob, alternatives
    (token, logprob; chat's bytes checked against the string) and ``text_offset`` (completions; None for chat)."""
    api = server.client()
    found: list[Scored] = []
    if chat:
        answer: Any = api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=max_tokens,
            temperature=0, logprobs=True, top_logprobs=num_top, stream=stream, extra_body={"ignore_eos": True})
    else:
        answer = api.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=max_tokens, temperature=0,
                                        logprobs=num_top, stream=stream, extra_body={"ignore_eos": True})
    for chunks, chunk in enumerate(answer if stream else [answer], start=1):
        for choice in chunk.choices:
            if choice.logprobs is None:
                continue
            if chat:
                for entry in choice.logprobs.content or []:
                    assert bytes(entry.bytes or []) == entry.token.encode()
                    found.append((entry.token, entry.logprob, [(t.token, t.logprob) for t in entry.top_logprobs],
                                  None))
            else:
                lp = choice.logprobs
                found += [(token, logprob, list(top.items()), offset) for token, logprob, top, offset in
                          zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset, strict=True)]
        if on_chunk is not None:
            on_chunk(chunks)
    return found


def _assert_same_logprobs(ours: list[Scored], theirs: list[Scored], rel: float | None = None) -> None:
    assert [(token, [t for t, _ in top], offset) for token, _, top, offset in ours] == \
        [(token, [t for t, _ in top], offset) for token, _, top, offset in theirs]
    assert [lp for _, lp, _, _ in ours] == pytest.approx([lp for _, lp, _, _ in theirs], rel=rel, abs=LOGPROB_ATOL)
    assert [[v for _, v in top] for _, _, top, _ in ours] == \
        [pytest.approx([v for _, v in top], rel=rel, abs=LOGPROB_ATOL) for _, _, top, _ in theirs]


@pytest.mark.parametrize("chat, num_top", [(False, 0), (False, 5), (True, 3), (True, 20)])
@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_equal_a_plain_serve(dynamo: KitServer, kit_servers: Servers, chat: bool, num_top: int,
                                      stream: bool) -> None:
    plain = kit_servers.get(LLMAPI)
    model = dynamo.state["model"]
    ours, theirs = (_scored(server, model, chat, stream, num_top) for server in (dynamo, plain))
    assert len(ours) == 12
    # chat: the k best; completions: a dict of the k best by text (greedy: the token among them; with 0, itself)
    assert all(len(top) == num_top if chat else 0 < len(top) <= max(num_top, 1) for _, _, top, _ in ours)
    _assert_same_logprobs(ours, theirs)


@pytest.mark.parametrize("max_tokens", [4, 0])  # 0: the prompt scored alone, as lm-eval's loglikelihood asks
@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_equals_a_plain_serve(dynamo: KitServer, kit_servers: Servers, max_tokens: int,
                                                 stream: bool) -> None:
    answers = []
    for server in (dynamo, kit_servers.get(LLMAPI)):
        answer: Any = server.client().completions.create(
            model=dynamo.state["model"], prompt="The capital of France is", max_tokens=max_tokens, temperature=0,
            logprobs=2, echo=True, stream=stream, extra_body={"ignore_eos": True})
        found: list[Scored] = []
        text = ""
        for chunk in answer if stream else [answer]:
            for choice in chunk.choices:
                text += choice.text
                lp = choice.logprobs
                if lp is not None:
                    found += [(token, logprob, list((top or {}).items()), offset) for token, logprob, top, offset in
                              zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset, strict=True)]
        answers.append((text, found))
    (text, ours), (plain_text, theirs) = answers
    assert text == plain_text and text.startswith("The capital of France is")
    assert ours[0][1] is None and theirs[0][1] is None  # the first prompt token has no logprob
    assert len(ours) == len(theirs) > 6
    _assert_same_logprobs(ours[1:], theirs[1:])


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_ending_on_its_end_token_is_scored_as_a_plain_serve_s(dynamo: KitServer, kit_servers: Servers,
                                                                        stream: bool) -> None:
    model = dynamo.state["model"]
    answers = []
    for server in (dynamo, kit_servers.get(LLMAPI)):
        body = {"model": model, "prompt": EOS_PROMPT_IDS, "max_tokens": 40, "temperature": 0, "logprobs": 1,
                "stream": stream}
        status, _, raw = server.post("/v1/completions", json.dumps(body).encode())
        assert status == 200, raw
        events = [json.loads(line.removeprefix("data:")) for line in raw.decode().splitlines()
                  if line.startswith("data:") and line != "data: [DONE]"] if stream else [json.loads(raw)]
        choices = [choice for event in events for choice in event["choices"]]
        answers.append(([t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]],
                        [lp for c in choices if c["logprobs"] for lp in c["logprobs"]["token_logprobs"]],
                        [c["finish_reason"] for c in choices if c["finish_reason"]]))
    (tokens, logprobs, reasons), (plain_tokens, plain_logprobs, plain_reasons) = answers
    assert reasons == plain_reasons == ["stop"] and 1 < len(tokens) < 40
    assert tokens == plain_tokens and tokens[-1] == ""  # the end token last, with its logprob, as OpenAI's
    assert logprobs == pytest.approx(plain_logprobs, abs=LOGPROB_ATOL)


def test_worker_killed_mid_stream_migrates_and_the_stream_is_unchanged(dynamo: KitServer) -> None:
    model = dynamo.state["model"]
    unfaulted, reason = _stream(dynamo, model, LONG_TOKENS)
    assert reason == "length"
    killed: list[int] = []
    faulted, reason = _stream(dynamo, model, LONG_TOKENS, on_chunk=_killer(dynamo.state, killed))
    assert killed, "the stream ended before a worker could be killed"
    assert reason == "length"
    assert faulted == unfaulted
    assert 'migration.reason="disconnected"' in Path(dynamo.state["log"]).read_text(errors="replace")  # it moved
    # the serve lives on with the other worker, and still answers
    assert _wait_gone(killed, 10) == []
    assert os.path.exists(f"/proc/{dynamo.state['pid']}")
    # ... and withdraws the dead worker from discovery, so no request is routed to it while its lease runs out
    assert _wait_withdrawn(dynamo.state, killed, 30) == []
    assert "1 discovery entries withdrawn" in (Path(dynamo.state["run_dir"]) / SERVE_LOG).read_text()
    assert _complete(dynamo, model, 4)["usage"]["completion_tokens"] == 4


def _killer(state: dict[str, Any], killed: list[int]) -> Any:
    """``on_chunk`` that SIGKILLs the worker generating the stream after its ``KILL_AT_CHUNK``-th chunk: the one that
    spent the most CPU since the stream began (read at once: a stream this short can end while a window is
    sampled, and the kill would then hit an idle worker)."""
    began = _worker_cpu_s(state)

    def kill_generating(chunks: int) -> None:
        if chunks == KILL_AT_CHUNK and not killed:
            now = _worker_cpu_s(state)
            spent = {pid: now[pid] - began[pid] for pid in now.keys() & began.keys()}
            assert spent, f"no worker of {state['workers']} is alive"
            pid = max(spent, key=lambda pid: spent[pid])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return kill_generating


@pytest.fixture(scope="module")
def migrating(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    """A serve with a worker for each migration test to kill and one left to take the stream over."""
    out = kit_builds.copy(LLMAPI, tmp_path_factory.mktemp("migrating") / "out")
    with KitServer(out, dynamo=True, workers=5, migration_limit=3) as server:
        yield server


def test_min_tokens_continue_across_a_migration(migrating: KitServer) -> None:
    model = migrating.state["model"]
    unfaulted, _ = _stream(migrating, model, LONG_TOKENS, min_tokens=LONG_TOKENS)
    killed: list[int] = []
    faulted, reason = _stream(migrating, model, LONG_TOKENS, _killer(migrating.state, killed),
                              min_tokens=LONG_TOKENS)
    assert killed, "the stream ended before a worker could be killed"
    assert reason == "length" and faulted == unfaulted  # min_tokens reduced by the tokens the dead worker sent
    assert _wait_withdrawn(migrating.state, killed, 30) == []  # the next test's migration cannot pick it


def test_logprobs_continue_across_a_migration(migrating: KitServer) -> None:
    model = migrating.state["model"]
    unfaulted = _scored(migrating, model, chat=False, stream=True, num_top=2, max_tokens=LONG_TOKENS)
    killed: list[int] = []
    faulted = _scored(migrating, model, chat=False, stream=True, num_top=2, max_tokens=LONG_TOKENS,
                      on_chunk=_killer(migrating.state, killed))
    assert killed, "the stream ended before a worker could be killed"
    assert len(faulted) == LONG_TOKENS  # the tokens sent keep theirs, the new worker scores the rest
    # the new worker computes the generated tokens' keys and values in one prefill, not step by step: its float32
    # sums round otherwise (observed: 1.3e-5 at a logprob of -4.49), the same tokens and alternatives
    _assert_same_logprobs(faulted, unfaulted, rel=FLOAT32_REL)
    assert _wait_withdrawn(migrating.state, killed, 30) == []  # the next test's migration cannot pick it


@pytest.mark.parametrize("extra, field", [
    ({"presence_penalty": 0.5}, "sampling_options.presence_penalty is 0.5"),
    ({"temperature": 0.8, "seed": 7}, "sampling_options.seed is 7"),
])
def test_a_migration_that_would_change_the_answer_is_refused(migrating: KitServer, extra: dict[str, Any],
                                                             field: str) -> None:
    model = migrating.state["model"]
    killed: list[int] = []
    _, _, errors = _stream_events(migrating, model, LONG_TOKENS, _killer(migrating.state, killed), **extra)
    assert killed, "the stream ended before a worker could be killed"
    # the stream ends with the worker's refusal, its sentence passed on by both frontends ...
    assert len(errors) == 1, errors
    error = json.loads(errors[0].removeprefix("data:"))["error"]
    assert error["type"] == "invalid_request_error" and "is not migrated: " + field in error["message"], errors
    logs = "".join(Path(w["log"]).read_text(errors="replace") for w in migrating.state["workers"].values())
    assert "is not migrated: " + field in logs  # ... and the worker that refused logs why, in one sentence
    assert _wait_withdrawn(migrating.state, killed, 30) == []  # the next test's migration cannot pick it


def test_stop_leaves_no_process(kit_builds: Builds, tmp_path: Path) -> None:
    out = kit_builds.copy(LLMAPI, tmp_path / "out")
    server = KitServer(out, dynamo=True, workers=1, router="round-robin").start()
    groups = _groups(server.state)
    assert all(group_alive(g) for g in groups)
    assert os.stat(Path(server.state["run_dir"]) / "dynamo").st_mode & 0o777 == 0o700
    namespace = server.state["net_namespace"]
    assert set(groups) <= set(pids_in(namespace))  # Dynamo's frontend and the worker live in it
    server.stop()
    assert _wait_gone(groups, 5) == []
    assert pids_in(namespace) == []
    assert not os.path.exists(f"/proc/{server.state['pid']}") or \
        psutil.Process(server.state["pid"]).status() == psutil.STATUS_ZOMBIE


def test_sigkill_of_serve_leaves_no_orphan(kit_builds: Builds, tmp_path: Path) -> None:
    out = kit_builds.copy(LLMAPI, tmp_path / "out")
    server = KitServer(out, dynamo=True, workers=1).start()
    groups = _groups(server.state)
    try:
        os.kill(server.state["pid"], signal.SIGKILL)
        assert _wait_gone(groups, 30) == []  # the reaper ends every group it was given
        assert pids_in(server.state["net_namespace"]) == []
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cpu_kv(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    """A serve of the cpu target's artifact, its two workers behind the KV router (its tests only ask it)."""
    out = kit_builds.copy(BuildKey.of(target="cpu"), tmp_path_factory.mktemp("cpu_kv") / "out")
    with KitServer(out, dynamo=True, workers=2, router="kv") as server:
        yield server


def test_cpu_artifact_greedy_answer_equals_a_plain_serve(cpu_kv: KitServer, kit_servers: Servers) -> None:
    plain = kit_servers.get(BuildKey.of(target="cpu"))
    model = cpu_kv.state["model"]
    ours, theirs = _complete(cpu_kv, model, 24), _complete(plain, model, 24)
    assert cpu_kv.state["target"] == "cpu"
    assert ours["usage"]["completion_tokens"] == theirs["usage"]["completion_tokens"] == 24
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]


def _served_by(state: dict[str, Any]) -> dict[str, int]:
    """Requests each worker has completed so far, from its log."""
    return {name: Path(w["log"]).read_text(errors="replace").count("request completed")
            for name, w in state["workers"].items()}


def test_kv_router_keeps_each_long_prefix_on_one_worker(cpu_kv: KitServer) -> None:
    prefixes = {"a": [1] + [200 + i % 300 for i in range(160)], "b": [1] + [600 + i % 300 for i in range(160)]}
    workers: dict[str, set[str]] = {"a": set(), "b": set()}
    for _ in range(4):
        for name, prompt in prefixes.items():
            before = _served_by(cpu_kv.state)
            body = {"model": cpu_kv.state["model"], "prompt": prompt, "max_tokens": 2, "temperature": 0}
            status, _, raw = cpu_kv.post("/v1/completions", json.dumps(body).encode())
            assert status == 200, raw
            deadline = time.monotonic() + 10
            while (after := _served_by(cpu_kv.state)) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            workers[name] |= {w for w in after if after[w] > before[w]}
            time.sleep(0.2)  # the stored blocks' events reach the router
    with urllib.request.urlopen(f"{cpu_kv.url}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert [len(workers["a"]), len(workers["b"])] == [1, 1], workers
    applied = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("dynamo_component_kv_cache_events_applied{")
               and 'event_type="stored"' in line and 'status="ok"' in line]
    assert sum(applied) >= 10, applied  # 5 full blocks of each prefix, at least, reached the router
