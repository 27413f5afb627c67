"""The frontend in front of one artifact served by another server (Dynamo's frontend, Ray Serve): its one route takes
token ids within the artifact's bounds, and the configuration serves that route alone with the gateway's files."""

from __future__ import annotations

from pathlib import Path

from kit_server import TINY_BUILDS, Builds

from trtllm_kit.serve.openai.artifact_route import artifact_route, route_config
from trtllm_kit.serve.repository_limits import max_batch_size, max_seq_len


def test_the_route_and_its_configuration(kit_builds: Builds, tmp_path: Path) -> None:
    out = kit_builds.get(TINY_BUILDS["llmapi"])
    route = artifact_route(out, "tiny", "dynamo")
    assert (route.name, route.triton_model, route.token_model, route.models, route.out, route.context_logits) == (
        "tiny", "dynamo", "dynamo", ("dynamo",), out, None)
    assert route.tokenizer_dir == out / "tokenizer" and route.tokenizer_dir.is_dir()
    assert (route.max_seq_len, route.max_batch_size) == (max_seq_len(out / "repo"), max_batch_size(out / "repo"))
    assert route.max_seq_len is not None and route.max_batch_size is not None

    keys, usage = tmp_path / "keys.toml", tmp_path / "usage.jsonl"
    config = route_config(route, "http://127.0.0.1:9", api_key="k", api_keys=keys, usage_log=usage)
    assert (config.grpc_url, config.served_name, config.triton_model, config.api_key, config.api_keys,
            config.usage_log, config.routes) == ("http://127.0.0.1:9", "tiny", "dynamo", "k", keys, usage, (route,))
    assert list(config.route_table().routes) == ["tiny"]
