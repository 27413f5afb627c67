"""The llmapi model's other helpers, without Triton: adapters by name, instance GPUs, gauge values, and the one
sentence ``initialize`` says when the kit is not installed where Triton runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtllm_kit.llmapi.cpu_types import LoRARequest
from trtllm_kit.model_repo.repository import python_source
from trtllm_kit.triton_models.llmapi_adapters import Adapters, lora_int_id
from trtllm_kit.triton_models.llmapi_gauges import GAUGES, make_gauges, stat_value
from trtllm_kit.triton_models.llmapi_instances import instance_gpus


def write_manifest(artifact: Path, adapters: dict[str, str]) -> None:
    records = {name: {"sha256": sha, "dir": f"lora/{name}"} for name, sha in adapters.items()}
    (artifact / "manifest.json").write_text(json.dumps({"summary": {"adapters": records}}))


def test_an_adapter_is_named_by_the_manifest_and_seen_when_it_changes(tmp_path: Path) -> None:
    adapters = Adapters(str(tmp_path))
    with pytest.raises(ValueError, match=r"LoRA adapter 'a' is not in the artifact .* \(it has: none\); add it with "):
        adapters.request("a", LoRARequest)
    write_manifest(tmp_path, {"a": "f" * 64})
    (tmp_path / "lora/a").mkdir(parents=True)
    request = adapters.request("a", LoRARequest)
    assert (request.lora_name, request.lora_int_id, request.lora_path) == ("a", 16**15, str(tmp_path / "lora/a"))
    write_manifest(tmp_path, {"b": "0" * 64})
    adapters.stamp = -1  # as if the file's mtime changed within its resolution
    with pytest.raises(ValueError, match=r"\(it has: b\)"):
        adapters.request("a", LoRARequest)
    assert lora_int_id("0" * 64) == 1


def config(count: int, ids: str | None = None) -> str:
    parameters = {} if ids is None else {"gpu_device_ids": {"string_value": ids}}
    return json.dumps({"instance_group": [{"count": count}], "parameters": parameters})


def test_each_instance_takes_its_gpu_group() -> None:
    assert instance_gpus({"model_config": config(1)}) == (0, 1, None)
    two = config(2, "0,1; 2,3")
    assert instance_gpus({"model_config": two, "model_instance_name": "tensorrt_llm_0_1"}) == (1, 2, "2,3")
    assert instance_gpus({"model_config": two, "model_instance_name": "tensorrt_llm_0_0"}) == (0, 2, "0,1")
    with pytest.raises(ValueError, match="2 instances need the gpu_device_ids parameter"):
        instance_gpus({"model_config": config(2)})
    with pytest.raises(ValueError, match="instance 2 has no GPU group in gpu_device_ids '0;1' \\(2 groups\\)"):
        instance_gpus({"model_config": config(3, "0;1"), "model_instance_name": "tensorrt_llm_0_2"})


def test_a_gauge_reads_its_key_path_and_zero_where_it_is_missing() -> None:
    stats = {"numActiveRequests": 3, "kvCacheStats": {"freeNumBlocks": 7, "usedNumBlocks": None}}
    assert stat_value(stats, ("numActiveRequests",)) == 3.0
    assert stat_value(stats, ("kvCacheStats", "freeNumBlocks")) == 7.0
    assert stat_value(stats, ("kvCacheStats", "usedNumBlocks")) == 0.0
    assert stat_value(stats, ("inflightBatchingStats", "numContextRequests")) == 0.0


def test_without_the_kit_initialize_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=1)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", backend)
    monkeypatch.setitem(sys.modules, "trtllm_kit.wire.llmapi", None)  # as where the kit is not installed
    spec = importlib.util.spec_from_file_location("model", python_source("tensorrt_llm_llmapi.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(RuntimeError, match=r"^the llmapi model needs the trtllm-kit package where Triton runs \(.*"
                                           r"\); run pip install trtllm-kit in the serving image\.$"):
        module.TritonPythonModel().initialize({})


def test_each_gauge_is_a_labelled_metric_of_its_family() -> None:
    made: list[tuple[str, dict[str, str]]] = []

    class Family:
        GAUGE = "gauge"

        def __init__(self, name: str, description: str, kind: str) -> None:
            self.name = name

        def Metric(self, labels: dict[str, str]) -> tuple[str, dict[str, str]]:  # pb_utils' name
            made.append((self.name, labels))
            return made[-1]

    families, gauges = make_gauges(SimpleNamespace(MetricFamily=Family), {"model": "m"})
    assert [f.name for f in families] == list(GAUGES)
    assert ("kvCacheStats", "freeNumBlocks") in [path for path, _ in gauges]
    assert ("nv_trt_llm_kv_cache_block_metrics", {"model": "m", "kv_cache_block_type": "free"}) in made
    assert len(gauges) == sum(len(values) for _, values in GAUGES.values())
