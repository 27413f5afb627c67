"""``serve --ray --router pow2``, two replicas, with real Ray on this machine: Ray Serve's default router spreads
the prompts of one prefix over both replicas (what the prefix router, ``test_ray_gateway.py``, does not)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from kit_server import BuildKey, Builds, KitServer
from prefix_turns import replicas_by_prefix

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Serve is not installed (pip install -c constraints.txt -e '.[ray]', as .ci/run does).",
                allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_TURNS = 8  # both prefixes on one replica each by chance: 1 in 2**14


@pytest.fixture(scope="module")
def pow2(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    out = kit_builds.copy(BuildKey.of(target="llmapi"), tmp_path_factory.mktemp("ray-pow2") / "out")
    with KitServer(out, ray=True, replicas="2:2", router="pow2", ready_timeout_s=600.0) as server:
        yield server


def test_without_the_prefix_router_a_prefix_goes_to_both_replicas(pow2: KitServer) -> None:
    assert pow2.state["router"] == "pow2"
    served = replicas_by_prefix(pow2, NUM_TURNS)
    assert any(len(replicas) == 2 for replicas in served.values()), served
