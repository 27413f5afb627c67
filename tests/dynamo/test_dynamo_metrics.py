"""The worker's prefix-cache metrics: the block manager's counters, their Prometheus text, and a real ``serve
--dynamo`` worker's ``/metrics`` rising on a repeated prefix and not on a fresh one."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from dynamo_installed import needs_dynamo
from kit_server import ONE_EACH, BuildKey, Builds, KitServer

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.runtime.block_manager import BlockManager
from trtllm_kit.runtime.sequence import SamplingParams as RuntimeParams
from trtllm_kit.runtime.sequence import Sequence
from trtllm_kit.serve.artifact_llm import artifact_llm
from trtllm_kit.serve.dynamo.launch import serve_net
from trtllm_kit.serve.dynamo.metrics import (
    SYSTEM_PORTS,
    PrefixCounts,
    exposition,
    prefix_counts,
    scrape,
    system_port,
    worker_metrics_urls,
)


def _run(manager: BlockManager, seq_id: int, token_ids: list[int]) -> None:
    """Allocate, compute, seal and free one sequence, as a finished request leaves its blocks."""
    seq = Sequence(seq_id, token_ids, RuntimeParams(max_tokens=1))
    manager.allocate(seq, len(token_ids))
    seq.num_computed_tokens = len(token_ids)
    manager.seal(seq)
    manager.free(seq)


def test_block_manager_counts_queried_and_cached_tokens() -> None:
    manager = BlockManager(num_blocks=8, tokens_per_block=4, enable_reuse=True)
    _run(manager, 0, list(range(10)))
    assert (manager.num_queried_tokens, manager.num_hit_tokens) == (10, 0)
    _run(manager, 1, [*range(9), 77])  # the same 2 full blocks, then another tail
    assert (manager.num_queried_tokens, manager.num_hit_tokens) == (20, 8)
    _run(manager, 2, list(range(50, 60)))  # a fresh prefix
    assert (manager.num_queried_tokens, manager.num_hit_tokens) == (30, 8)
    _run(manager, 3, list(range(8)))  # the last token's block is never a hit
    assert (manager.num_queried_tokens, manager.num_hit_tokens) == (38, 12)


def test_block_manager_without_reuse_counts_nothing() -> None:
    manager = BlockManager(num_blocks=8, tokens_per_block=4, enable_reuse=False)
    _run(manager, 0, list(range(10)))
    _run(manager, 1, list(range(10)))
    assert (manager.num_queried_tokens, manager.num_hit_tokens) == (0, 0)


def test_exposition_names_the_families_and_reads_back() -> None:
    manager = BlockManager(num_blocks=8, tokens_per_block=4, enable_reuse=True)
    _run(manager, 0, list(range(10)))
    _run(manager, 1, list(range(10)))
    held = Sequence(2, list(range(100, 106)), RuntimeParams(max_tokens=1))
    manager.allocate(held, 6)  # 2 of 8 blocks in use
    text = exposition(manager, "tiny")
    lines = text.splitlines()
    assert 'trtllm_kit:prefix_cache_queries_total{model_name="tiny"} 26.0' in lines
    assert 'trtllm_kit:prefix_cache_hits_total{model_name="tiny"} 8.0' in lines
    assert 'trtllm_kit:kv_cache_usage_perc{model_name="tiny"} 0.25' in lines
    assert "# TYPE trtllm_kit:prefix_cache_queries_total counter" in lines
    assert prefix_counts(text) == PrefixCounts(26, 8)
    assert (prefix_counts(text) - PrefixCounts(16, 4)).hit_rate == pytest.approx(0.4)


def test_metrics_without_the_families_are_refused() -> None:
    with pytest.raises(KitError, match=r"names no trtllm_kit:prefix_cache_hits or trtllm_kit:prefix_cache_queries"):
        prefix_counts("# TYPE other counter\nother_total 1\n")


def test_ready_files_name_each_worker_s_metrics(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    (ready / "worker-1").write_text("http://127.0.0.1:20002/metrics\n")
    (ready / "worker-0").write_text("http://127.0.0.1:20001/metrics\n")
    (ready / "worker-2.part").write_text("http://127.0.0.1:2")  # being written
    (ready / "worker-0.instance").write_text("18215768850392725696\n")  # its Dynamo instance id (discovery.py)
    assert worker_metrics_urls(tmp_path) == {"worker-0": "http://127.0.0.1:20001/metrics",
                                             "worker-1": "http://127.0.0.1:20002/metrics"}


def test_system_port_is_free_and_below_dynamo_s_bound() -> None:
    port = system_port("127.0.0.1")
    assert port in SYSTEM_PORTS and port < 1 << 15
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free: it binds


def test_a_directory_without_ready_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KitUsageError, match=r"holds no worker ready file; pass the RUN_DIR/dynamo"):
        worker_metrics_urls(tmp_path)


@pytest.mark.parametrize(("repo", "num_blocks", "is_reused"), [
    ({}, 8 * 1024 // 32, True),  # max_batch_size x max_seq_len, as the artifact's Triton model
    ({"max_tokens_in_paged_kv_cache": 2048, "enable_kv_cache_reuse": False}, 2048 // 32, False),
])
def test_worker_llm_has_the_cpu_artifact_s_kv_pool_and_reuse(kit_builds: Builds, repo: dict[str, object],
                                                             num_blocks: int, is_reused: bool) -> None:
    llm, limits = artifact_llm(kit_builds.get(BuildKey.of(repo={**ONE_EACH, **repo})))
    try:
        blocks = llm.engine.scheduler.block_manager
        assert (limits.max_batch_size, limits.max_seq_len, limits.tokens_per_block) == (8, 1024, 32)
        assert (blocks.num_blocks, blocks.enable_reuse) == (num_blocks, is_reused)
    finally:
        llm.shutdown()


@pytest.mark.integration
@pytest.mark.slow
@needs_dynamo
def test_worker_metrics_count_a_repeated_prefix_and_not_a_fresh_one(kit_builds: Builds, tmp_path: Path) -> None:
    out = kit_builds.copy(BuildKey.of(target="cpu"), tmp_path / "out")
    with KitServer(out, dynamo=True, workers=1) as server:
        root = Path(server.state["run_dir"]) / "dynamo"
        urls = worker_metrics_urls(root)
        assert list(urls) == ["worker-0"] and urls["worker-0"].startswith("http://127.0.0.1:")
        net = serve_net(root)  # the workers' /metrics answer inside the serve's network namespace alone

        def complete(prompt: list[int]) -> PrefixCounts:
            body = {"model": server.state["model"], "prompt": prompt, "max_tokens": 2, "temperature": 0}
            status, _, raw = server.post("/v1/completions", json.dumps(body).encode())
            assert status == 200, raw
            return net.call(scrape, urls["worker-0"])

        def read(url: str) -> str:
            with urllib.request.urlopen(url, timeout=10) as response:
                return str(response.read().decode())

        try:
            prefix = [1] + [200 + i % 300 for i in range(160)]
            start = net.call(scrape, urls["worker-0"])
            first = complete([*prefix, 7])
            again = complete([*prefix, 8])
            fresh = complete([1] + [600 + i % 300 for i in range(160)] + [9])
            text = net.call(read, urls["worker-0"])
        finally:
            net.close()
    assert "dynamo_component_requests_total" in text  # Dynamo's own worker metrics beside the kit's
    assert first.queried_tokens - start.queried_tokens == 162
    assert again - first == PrefixCounts(162, 160)  # 5 blocks of 32 tokens found cached
    assert fresh - again == PrefixCounts(162, 0)

