"""``DisaggregatedParams`` on the CPU ``LLM``: a context-only request in this process, the generation-only request
in another process that fetches the KV blocks over the Unix socket; greedy output token-exact against one engine
running the whole request, and the context side's blocks freed after the transfer, after a receiver killed
mid-transfer, and after a timeout when nobody fetches."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trtllm_kit.llmapi.cpu_llm import LLM, DisaggregatedParams, RequestError, SamplingParams
from trtllm_kit.llmapi.kv_state import KV_KEY_ENV
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model

pytestmark = pytest.mark.slow
torch.set_num_threads(1)
TIMEOUT_MS = 1500
KEY = "a transfer key both processes share"
PROMPTS = [[1, 415, 565], list(range(3, 70)), list(range(100, 164)), [7] * 31, list(range(200, 390))]
# The generation process: one JSON request per stdin line → one JSON line of output ids.
GENERATION = """
import asyncio, json, sys, torch
from trtllm_kit.llmapi.cpu_llm import LLM, DisaggregatedParams, SamplingParams
torch.set_num_threads(1)
llm = LLM(model=sys.argv[1], max_seq_len=512, tensor_parallel_size=2, kv_cache_config={"tokens_per_block": 16})
async def one(line):
    request = json.loads(line)
    params = DisaggregatedParams.from_wire(request["disaggregated_params"])
    result = llm.generate_async(request["prompt"], SamplingParams(max_tokens=request["max_tokens"]),
                                streaming=request["stream"], disaggregated_params=params)
    if request["stream"]:
        ids = [t async for output in result for t in output.outputs[0].token_ids_diff]
    else:
        ids = (await result.aresult()).outputs[0].token_ids
    return {"ids": list(ids), "transfers": llm.get_stats()[-1]["kvTransferStats"]["numTransfers"]}
print("ready", flush=True)
for line in sys.stdin:
    print(json.dumps(asyncio.run(one(line))), flush=True)
llm.shutdown()
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    write_unified(inspect_model("builtin:tiny-llama"), out, "float32")
    return out


@pytest.fixture(scope="module")
def ctx(ckpt: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KV_KEY_ENV, KEY)
        made = LLM(model=str(ckpt), max_seq_len=512, cache_transceiver_config={"kv_transfer_timeout_ms": TIMEOUT_MS})
    yield made
    made.shutdown()


@pytest.fixture(scope="module")
def generation(ckpt: Path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), KV_KEY_ENV: KEY}
    proc = subprocess.Popen([sys.executable, "-c", GENERATION, str(ckpt)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def whole(llm: LLM, prompt: list[int], max_tokens: int, disagg: DisaggregatedParams | None = None):
    async def go():
        return (await llm.generate_async(prompt, SamplingParams(max_tokens=max_tokens),
                                         disaggregated_params=disagg).aresult()).outputs[0]
    return run(go())


def free_blocks(llm: LLM, expected: int) -> int:
    """The pool's free blocks once they reach ``expected`` (or the last count seen within 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        free = llm.get_stats()[-1]["kvCacheStats"]["freeNumBlocks"]
        if free == expected or time.monotonic() > deadline:
            return free
        time.sleep(0.05)


def context_only(ctx: LLM, prompt: list[int]) -> DisaggregatedParams:
    out = whole(ctx, prompt, 16, DisaggregatedParams(request_type="CONTEXT_ONLY"))
    assert len(out.token_ids) == 1 and out.finish_reason == "length"
    params = out.disaggregated_params
    assert params.request_type == "context_only" and params.first_gen_tokens == out.token_ids
    assert params.opaque_state is not None and params.ctx_request_id is not None
    return params


@pytest.mark.parametrize("stream", [False, True])
def test_generation_in_another_process_is_token_exact_and_frees_the_context_blocks(ctx, generation, stream):
    num_blocks = ctx.get_stats()[-1]["kvCacheStats"]["maxNumBlocks"]
    for i, prompt in enumerate(PROMPTS):
        max_tokens = 4 + 3 * i
        expected = whole(ctx, prompt, max_tokens).token_ids
        assert free_blocks(ctx, num_blocks) == num_blocks
        params = context_only(ctx, prompt)
        assert ctx.get_stats()[-1]["kvTransferStats"]["numHeldRequests"] == 1
        params.request_type = "generation_only"
        request = {"prompt": prompt, "max_tokens": max_tokens, "stream": stream,
                   "disaggregated_params": json.loads(json.dumps(params.to_wire()))}
        generation.stdin.write(json.dumps(request) + "\n")
        generation.stdin.flush()
        answer = json.loads(generation.stdout.readline())
        assert answer["ids"] == expected, prompt
        assert free_blocks(ctx, num_blocks) == num_blocks  # released after the transfer, long before the timeout
    assert answer["transfers"] == len(PROMPTS) * (1 + stream)


def test_blocks_nobody_fetches_are_freed_after_the_timeout(ctx):
    num_blocks = ctx.get_stats()[-1]["kvCacheStats"]["maxNumBlocks"]
    params = context_only(ctx, PROMPTS[1])
    assert ctx.get_stats()[-1]["kvCacheStats"]["freeNumBlocks"] < num_blocks
    assert free_blocks(ctx, num_blocks) == num_blocks
    params.request_type = "generation_only"
    with pytest.raises(RequestError, match="fetched already or expired"):
        whole(ctx, PROMPTS[1], 8, params)  # the handle is gone; the request fails with the reason


def test_a_receiver_killed_mid_transfer_leaks_no_blocks(ctx, tmp_path):
    num_blocks = ctx.get_stats()[-1]["kvCacheStats"]["maxNumBlocks"]
    state = json.loads(context_only(ctx, PROMPTS[4]).opaque_state)
    receiver = subprocess.Popen([sys.executable, "-c", (
        "import json, socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "s.sendall(json.dumps({'handle': sys.argv[2]}).encode() + b'\\n')\n"
        "s.recv(64); print('reading', flush=True); time.sleep(600)\n"), state["endpoint"], state["handle"]],
        stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "reading"
        receiver.send_signal(signal.SIGKILL)
    finally:
        receiver.wait()
    assert free_blocks(ctx, num_blocks) == num_blocks


def test_the_parameters_and_the_wire_refuse_what_cannot_run(ctx):
    with pytest.raises(ValueError, match="request_type is 'prefill'"):
        DisaggregatedParams(request_type="prefill")
    with pytest.raises(ValueError, match="first_gen_tokens must be a list"):
        DisaggregatedParams.from_wire({"request_type": "generation_only", "first_gen_tokens": "12"})
    with pytest.raises(ValueError, match="needs the context-only response's first_gen_tokens"):
        whole(ctx, PROMPTS[0], 4, DisaggregatedParams(request_type="generation_only"))
    forged = DisaggregatedParams(request_type="generation_only", first_gen_tokens=[5], opaque_state=b"nonsense")
    with pytest.raises(ValueError, match="was not made by a context server of this serve"):
        whole(ctx, PROMPTS[0], 4, forged)
    with socket.socket(socket.AF_UNIX) as probe:  # the socket lives in a directory only its owner can enter
        endpoint = json.loads(context_only(ctx, PROMPTS[0]).opaque_state)["endpoint"]
        assert os.stat(Path(endpoint).parent).st_mode & 0o077 == 0
        probe.connect(endpoint)
