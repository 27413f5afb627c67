"""A/B aliases: parsing, the stable per-user choice, and 1,000 requests through a real tritonserver serving two tiny
Llamas (CPU runtime) whose shares, headers and Prometheus counter agree.

Tolerance: with share p over n requests the count of a model is binomial, sd = sqrt(n p (1 - p)); for 90/10 over
1,000 that is 9.5 requests, and the test accepts 4 sd (38 requests, 3.8 points of share) either side.
"""

from __future__ import annotations

import http.client
import json
import math
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from kit_server import BuildKey, Builds, KitServer
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.openai.routes import Alias

MODEL = "builtin:tiny-llama"
NUM_REQUESTS, SHARE_A = 1000, 0.9
TOLERANCE = 4 * math.sqrt(NUM_REQUESTS * SHARE_A * (1 - SHARE_A))  # 37.9 requests


def test_alias_parse_and_split() -> None:
    alias = Alias.parse("chat=a:90,b:10")
    assert alias.name == "chat" and alias.shares == (("a", 90), ("b", 10)) and alias.split == "a:90,b:10"
    assert Alias.parse("x=org/m:1:3,n:1").shares == (("org/m:1", 3), ("n", 1))  # the weight follows the last colon
    for bad in ("chat", "chat=a:90", "chat=a:0,b:1", "chat=a:x,b:1", "chat=a:1,a:2", "=a:1,b:1"):
        with pytest.raises(KitUsageError, match="is not NAME=MODEL:WEIGHT,MODEL:WEIGHT"):
            Alias.parse(bad)


def test_user_choice_is_a_stable_hash_and_splits_users_by_the_shares() -> None:
    alias = Alias.parse("chat=a:90,b:10")
    picks = {f"user-{i}": alias.pick(f"user-{i}", random.Random(i)) for i in range(2000)}
    assert all(alias.pick(user, random.Random(7)) == model for user, model in picks.items())  # whatever the rng
    assert alias.pick("user-0", random.Random(0)) == "a" and alias.pick("user-1", random.Random(0)) == "b"
    assert abs(Counter(picks.values())["a"] - 1800) < 4 * math.sqrt(2000 * 0.09)


@pytest.fixture(scope="module")
def served(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory):
    """Its own serve of two copies of the session's build, ``a`` and ``b``, behind the alias ``chat``."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("alias")
    outs = [kit_builds.copy(BuildKey.of(max_batch_size=8), root / name) for name in ("a", "b")]
    with KitServer(outs[0], more=(outs[1],), names=(f"a={outs[0]}", f"b={outs[1]}"),
                   aliases=("chat=a:90,b:10",)) as server:
        yield server.port


def complete(port: int, user: str | None) -> tuple[str, str, str]:
    """(the model header, the split header, the body's model and fingerprint) of one max_tokens=1 request."""
    body = {"model": "chat", "prompt": [3, 4, 5], "max_tokens": 1, **({"user": user} if user else {})}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200, answer
        assert answer["system_fingerprint"] == f"{answer['model']}-v1"
        return response.getheader("x-trtllm-kit-model"), response.getheader("x-trtllm-kit-split"), answer["model"]
    finally:
        connection.close()


def alias_counts(port: int) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return {s.labels["model"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "trtllm_kit_openai_alias_requests" for s in f.samples if s.name.endswith("_total")}


@pytest.mark.integration
@pytest.mark.slow
def test_thousand_requests_split_by_the_shares_sticky_per_user(served: int) -> None:
    users = [f"tenant-{i}" for i in range(50)] * 2  # each user twice
    with ThreadPoolExecutor(8) as pool:  # bounded concurrency
        anonymous = list(pool.map(lambda _: complete(served, None), range(NUM_REQUESTS)))
        named = list(pool.map(lambda user: complete(served, user), users))
    for header, split, model in anonymous + named:
        assert header == model and split == "chat=a:90,b:10"
    shares = Counter(model for _, _, model in anonymous)
    print(f"alias chat=a:90,b:10 over {NUM_REQUESTS} requests: a {shares['a']}, b {shares['b']} "
          f"(tolerance +-{TOLERANCE:.0f})")
    assert abs(shares["a"] - NUM_REQUESTS * SHARE_A) <= TOLERANCE and shares["a"] + shares["b"] == NUM_REQUESTS
    by_user: dict[str, set[str]] = {}
    for user, (_, _, model) in zip(users, named, strict=True):
        by_user.setdefault(user, set()).add(model)
    assert all(len(models) == 1 for models in by_user.values())
    assert all(models == {Alias.parse("chat=a:90,b:10").pick(user, random.Random())}
               for user, models in by_user.items())
    total = Counter(model for _, _, model in anonymous + named)
    assert alias_counts(served) == {"a": float(total["a"]), "b": float(total["b"])}
