"""A generation-only request on the CPU ``LLM`` fetches KV blocks only from an endpoint a context peer signed, and
whatever a signed peer sends back, that request alone ends with the reason.

Before the fix: a client's ``opaque_state`` naming any Unix socket made the LLM connect there and write to it, and
the error said whether the path existed; a header with a shape of 1e30, of 2^46 elements, of an infinite size, or
nested 5,000 deep raised in the fetching thread, which died: the request was never answered."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from kv_peer import HANDLE, KvPeer, header, signed_state, unsigned_state

from trtllm_kit.llmapi.cpu_llm import LLM, DisaggregatedParams, RequestError, SamplingParams
from trtllm_kit.llmapi.kv_state import KV_KEY_ENV, MAX_STATE_BYTES
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model

torch.set_num_threads(1)
KEY = "the transfer key of this test's roles"
PROMPT = [1, 415, 565]
ANSWER_S = 30  # a hang guard: every hostile request is answered long before it


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    ckpt = tmp_path_factory.mktemp("ckpt")
    write_unified(inspect_model("builtin:tiny-llama"), ckpt, "float32")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KV_KEY_ENV, KEY)
        made = LLM(model=str(ckpt), max_seq_len=256)
    yield made
    made.shutdown()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory whose socket paths stay far below the 107-byte limit."""
    path = Path(tempfile.mkdtemp(prefix="kvt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def generate(llm: LLM, disagg: DisaggregatedParams | None = None, max_tokens: int = 6) -> list[int]:
    async def go() -> list[int]:
        result = llm.generate_async(PROMPT, SamplingParams(max_tokens=max_tokens), disaggregated_params=disagg)
        return list((await result.aresult()).outputs[0].token_ids)
    return asyncio.run(asyncio.wait_for(go(), ANSWER_S))


def generation_only(opaque_state: bytes) -> DisaggregatedParams:
    return DisaggregatedParams(request_type="generation_only", first_gen_tokens=[5], opaque_state=opaque_state)


def still_serves(llm: LLM) -> None:
    """A genuine context-only then generation-only pair through this LLM is token-exact against one request."""
    expected = generate(llm)
    params = asyncio.run(asyncio.wait_for(_context_only(llm), ANSWER_S))
    params.request_type = "generation_only"
    assert generate(llm, params) == expected


async def _context_only(llm: LLM) -> DisaggregatedParams:
    result = llm.generate_async(PROMPT, SamplingParams(max_tokens=6),
                                disaggregated_params=DisaggregatedParams(request_type="context_only"))
    params = (await result.aresult()).outputs[0].disaggregated_params
    assert params is not None and params.opaque_state is not None
    return params


def test_a_state_no_context_peer_signed_is_refused_before_anything_connects(llm: LLM, short_dir: Path) -> None:
    peer = KvPeer(short_dir / "peer.sock", header() + b"\0" * 64)
    elsewhere = str(short_dir / "peer-of-another-serve.sock")
    try:
        forged = {
            "unsigned": unsigned_state(str(peer.path)),
            "signed with another key": signed_state("another serve's key", str(peer.path)),
            "endpoint changed after signing": json.dumps(
                {**json.loads(signed_state(KEY, elsewhere)), "endpoint": str(peer.path)}).encode(),
            "too long": json.dumps({"endpoint": str(peer.path), "handle": HANDLE,
                                    "pad": "x" * MAX_STATE_BYTES}).encode(),
            "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
        }
        for name, state in forged.items():
            with pytest.raises(ValueError, match="encoded_opaque_state was not made by a context server") as refused:
                generate(llm, generation_only(state))
            assert str(short_dir) not in str(refused.value), name
        messages = set()
        for path in (str(peer.path), str(short_dir / "nothing-here.sock"), "/etc/passwd", str(short_dir)):
            with pytest.raises(ValueError) as refused:
                generate(llm, generation_only(unsigned_state(path)))
            messages.add(str(refused.value))
        assert len(messages) == 1, messages  # the answer says nothing of which paths exist
        time.sleep(0.5)
        assert peer.num_connections == 0
    finally:
        peer.close()
    still_serves(llm)


@pytest.mark.parametrize(("name", "reply", "said"), [
    ("shape 1e30", header(shape=[1e30, 1, 32, 2, 64]), "shape is [1e+30"),
    ("2^46 elements", header(shape=[2 ** 10, 2 ** 10, 2 ** 10, 2 ** 10, 2 ** 6]), "shape is [1024, 1024"),
    ("an infinite size", header(shape=[3, 1, 1e400, 2, 64]), "shape is [3, 1, inf"),
    ("num_tokens not a number", header(num_tokens="three") + b"\0" * 2 * 3 * 32 * 2 * 64 * 4, "num_tokens is three"),
    ("nested 5,000 deep", b"[" * 5000 + b"]" * 5000 + b"\n", "longer than 1024 bytes"),
])
def test_a_forged_header_from_a_signed_peer_ends_that_request_alone(llm: LLM, short_dir: Path, name: str,
                                                                    reply: bytes, said: str) -> None:
    peer = KvPeer(short_dir / "peer.sock", reply)
    try:
        started = time.monotonic()
        with pytest.raises(RequestError, match="the context server") as refused:
            generate(llm, generation_only(signed_state(KEY, str(peer.path))))
        assert said in str(refused.value), (name, str(refused.value))
        assert str(short_dir) not in str(refused.value)
        assert time.monotonic() - started < ANSWER_S
        assert peer.num_connections == 1
    finally:
        peer.close()
    still_serves(llm)
