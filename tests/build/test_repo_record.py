"""The repository record's options are typed: the resolved [repo] table, or the llmapi repository's own, each read
back from the manifest's JSON as the type it was written as."""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_kit.artifact import EngineLimits, LlmapiRepoOptions, RepoRecord
from trtllm_kit.enums import SchedulerPolicy
from trtllm_kit.spec.repo_options import RepoOptions

LIMITS = EngineLimits("cpu", Path("checkpoint"), 8, 256, 128, 1, 32, True, 1, 1)


def record(options: RepoOptions | LlmapiRepoOptions) -> RepoRecord:
    return RepoRecord("repo", "1", "cpu", ["tensorrt_llm"], True, "/out/checkpoint", LIMITS, options)


def test_each_options_shape_reads_back_as_its_type() -> None:
    standard = record(RepoOptions(decoupled=False, max_queue_size=12,
                                  batch_scheduler_policy=SchedulerPolicy.MAX_UTILIZATION))
    llmapi = record(LlmapiRepoOptions(decoupled=True, llm_args={"max_batch_size": 8, "kv_cache_config": {}},
                                      instances=2, gpu_device_ids="0;1"))
    for written in (standard, llmapi):
        read = RepoRecord.from_dict(json.loads(json.dumps(written.to_dict())))
        assert read == written and type(read.options) is type(written.options)
    assert standard.to_dict()["options"]["batch_scheduler_policy"] == "max_utilization"


def test_a_record_without_options_reads_the_defaults() -> None:
    values = record(RepoOptions()).to_dict()
    values["options"] = {}
    assert RepoRecord.from_dict(values).options == RepoOptions()
