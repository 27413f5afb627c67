"""The prefix router's choices without a running Ray: a prefix's owner first, power of two choices for a prefix
not seen, when the owner carries too many requests, or when it died; and the prefix key it routes by."""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest

from trtllm_kit.serve.ray.prefix import CHARS_PER_TOKEN, prefix_key
from trtllm_kit.wire import GenerationRequest

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Serve is not installed (pip install -c constraints.txt -e '.[ray]', as .ci/run does).",
                allow_module_level=True)

from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve._private.request_router.common import ReplicaQueueLengthCache

from trtllm_kit.serve.ray.prefix_router import PrefixRouter

BLOCK = 4
IDS = {name: ReplicaID(name, DeploymentID(name="model", app_name="trtllm-kit")) for name in ("a", "b", "c")}
REPLICAS: list[Any] = [SimpleNamespace(replica_id=replica_id, max_ongoing_requests=8) for replica_id in IDS.values()]


def _router(max_imbalance: int = 2, max_prefixes: int = 100) -> PrefixRouter:
    router = PrefixRouter.__new__(PrefixRouter)  # the state Ray's constructor would set that the policy reads
    router._replica_queue_len_cache = ReplicaQueueLengthCache()
    router._replicas = {replica.replica_id: replica for replica in REPLICAS}
    router._replicas_list = list(REPLICAS)
    router._replica_id_set = set(router._replicas)
    router._queue_len_gauge_last_update = {}
    router.initialize_state(tokens_per_block=BLOCK, max_imbalance=max_imbalance, max_prefixes=max_prefixes)
    return router


def _request(prompt: Any) -> Any:
    return SimpleNamespace(args=[GenerationRequest(prompt)], kwargs={})


def _choose(router: PrefixRouter, prompt: Any) -> list[list[str]]:
    ranks = asyncio.run(router.choose_replicas(list(REPLICAS), _request(prompt)))
    return [[replica.replica_id.unique_id for replica in rank] for rank in ranks]


def test_a_new_prefix_goes_to_two_replicas_drawn_at_random() -> None:
    ranks = _choose(_router(), (1, 2, 3, 4, 5))
    assert len(ranks) == 1 and len(ranks[0]) == 2 and set(ranks[0]) <= {"a", "b", "c"}


def test_a_prefix_goes_first_to_the_replica_that_served_it_last() -> None:
    router = _router()
    router.on_request_routed(_request((1, 2, 3, 4, 5)), IDS["c"], None)
    for tail in (6, 7, 8):
        ranks = _choose(router, (1, 2, 3, 4, tail))
        assert ranks[0] == ["c"]
        assert "c" not in ranks[1]  # then the drawn ones, should c refuse
    assert len(_choose(router, (9, 2, 3, 4, 5))[0]) == 2  # another first block: not c's


def test_an_owner_too_loaded_falls_back_to_power_of_two() -> None:
    router = _router(max_imbalance=2)
    router.on_request_routed(_request((1, 2, 3, 4)), IDS["a"], None)
    for name, load in (("a", 3), ("b", 1), ("c", 2)):
        router.replica_queue_len_cache.update(IDS[name], load)
    assert _choose(router, (1, 2, 3, 4))[0] == ["a"]  # 3 - 1 is within 2
    router.replica_queue_len_cache.update(IDS["a"], 4)
    assert len(_choose(router, (1, 2, 3, 4))[0]) == 2  # 4 - 1 is not


def test_a_dead_replicas_prefixes_are_forgotten() -> None:
    router = _router()
    router.on_request_routed(_request((1, 2, 3, 4)), IDS["b"], None)
    router.on_replica_actor_died(IDS["b"])
    assert router.owners == {}
    assert len(_choose(router, (1, 2, 3, 4))[0]) == 2


def test_the_table_keeps_the_most_recent_prefixes_and_skips_short_prompts() -> None:
    router = _router(max_prefixes=2)
    for first in (10, 20, 30):
        router.on_request_routed(_request((first, 2, 3, 4)), IDS["a"], None)
    router.on_request_routed(_request((1, 2)), IDS["a"], None)  # shorter than a block: nothing to reuse
    assert list(router.owners) == [prefix_key((20, 2, 3, 4), BLOCK), prefix_key((30, 2, 3, 4), BLOCK)]


@pytest.mark.parametrize(("first", "second", "same"), [
    ((1, 2, 3, 4, 5), (1, 2, 3, 4, 9, 9), True),
    ((1, 2, 3, 4), (1, 2, 3, 5), False),
    ("x" * BLOCK * CHARS_PER_TOKEN + "tail", "x" * BLOCK * CHARS_PER_TOKEN + "other", True),
    ("x" * BLOCK * CHARS_PER_TOKEN, "y" + "x" * BLOCK * CHARS_PER_TOKEN, False),
])
def test_the_prefix_key_is_the_first_blocks(first: Any, second: Any, same: bool) -> None:
    assert (prefix_key(first, BLOCK) == prefix_key(second, BLOCK)) is same


def test_a_prompt_shorter_than_a_block_has_no_key() -> None:
    assert prefix_key((1, 2, 3), BLOCK) is None
    assert prefix_key("x" * (BLOCK * CHARS_PER_TOKEN - 1), BLOCK) is None
