"""Generated ``config.pbtxt``: protobuf messages that round-trip, golden files for both targets, and the
``tensorrt_llm`` parameters checked against the spec's parameter table (docs/triton-repo.md §3.2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_material import CPU_LIMITS, ENGINE_LIMITS

from trtllm_kit.model_repo import tensors as T
from trtllm_kit.model_repo.configs import BACKEND_DEFAULT_KEYS, parse_config, repository_configs, to_text
from trtllm_kit.model_repo.options import resolve_options
from trtllm_kit.names import MODEL_NAMES
from trtllm_kit.spec.repo_options import RepoOptions

GOLDEN = Path(__file__).parent / "golden"
LIMITS = {"engine": ENGINE_LIMITS, "cpu": CPU_LIMITS}
# Every key of the spec's §3.2 table (the C++ backend's parameters).
SPEC_PARAMETERS = (
    "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path", "encoder_model_path",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length", "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction", "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks", "enable_trt_overlap", "exclude_input_in_output", "cancellation_check_period_ms",
    "stats_check_period_ms", "iter_stats_max_iterations", "request_stats_max_iterations", "enable_kv_cache_reuse",
    "normalize_log_probs", "enable_chunked_context", "gpu_device_ids", "participant_ids", "num_nodes",
    "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes", "lora_prefetch_dir", "decoding_mode", "executor_worker_path",
    "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size", "medusa_choices",
    "eagle_choices", "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode",
    "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
)
# What the kit sets, per the spec's advice (and the plan: 64 × 4096 tokens of KV for the engine limits).
ENGINE_VALUES = {
    "gpt_model_type": "inflight_fused_batching", "gpt_model_path": "/models/engines", "max_beam_width": "1",
    "FORCE_CPU_ONLY_INPUT_TENSORS": "no", "max_tokens_in_paged_kv_cache": "262144",
    "batch_scheduler_policy": "guaranteed_no_evict", "kv_cache_free_gpu_mem_fraction": "0.9",
    "enable_kv_cache_reuse": "true", "enable_chunked_context": "true", "exclude_input_in_output": "true",
    "decoding_mode": "top_k_top_p", "gpu_weights_percent": "1.0",
}
CPU_EXTRA = {"max_batch_size": "8", "max_num_tokens": "2048", "max_seq_len": "1024", "tokens_per_block": "32",
             "max_queue_size": "32", "decoupled": "true"}


NUM_CPUS = 64  # a build machine with cores to spare: the golden files' instance counts follow the batch size


def configs(target: str):
    limits = LIMITS[target]
    return repository_configs(limits, resolve_options(RepoOptions(), limits, 0.9, num_cpus=NUM_CPUS), limits.model_dir,
                              Path("tokenizer"))


@pytest.mark.parametrize("target", ["engine", "cpu"])
def test_configs_round_trip_and_equal_golden_files(target: str) -> None:
    generated = configs(target)
    assert tuple(generated) == MODEL_NAMES
    for name, config in generated.items():
        text = to_text(config)
        assert parse_config(text) == config
        assert "${" not in text
        assert text == (GOLDEN / target / f"{name}.pbtxt").read_text(), f"{target}/{name} differs from its golden file"


@pytest.mark.parametrize("target", ["engine", "cpu"])
def test_tensorrt_llm_sets_every_spec_parameter_or_names_why_not(target: str) -> None:
    config = parse_config((GOLDEN / target / "tensorrt_llm.pbtxt").read_text())
    params = {k: v.string_value for k, v in config.parameters.items()}
    spec_keys = set(SPEC_PARAMETERS)
    assert spec_keys - set(BACKEND_DEFAULT_KEYS) == set(params) & spec_keys
    assert not set(BACKEND_DEFAULT_KEYS) & set(params)
    expected = dict(ENGINE_VALUES)
    if target == "cpu":
        expected.update(CPU_EXTRA, gpt_model_path="/models/checkpoint", max_tokens_in_paged_kv_cache="8192")
        assert set(params) - spec_keys == set(CPU_EXTRA)
    else:
        assert set(params) <= spec_keys
    assert {k: params[k] for k in expected} == expected
    assert config.backend == ("python" if target == "cpu" else "tensorrtllm")
    assert config.max_batch_size == LIMITS[target].max_batch_size
    assert config.model_transaction_policy.decoupled
    assert list(config.dynamic_batching.preferred_batch_size) == [LIMITS[target].max_batch_size]
    assert config.dynamic_batching.HasField("default_queue_policy")
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, 2)]  # KIND_CPU


@pytest.mark.parametrize("target", ["engine", "cpu"])
def test_tensors_are_the_upstream_table_on_both_targets(target: str) -> None:
    config = configs(target)["tensorrt_llm"]
    inputs = {t.name: t for t in config.input}
    assert [t.name for t in config.input] == [t.name for t in T.TRTLLM_INPUTS]
    assert [t.name for t in config.output] == [t.name for t in (*T.TRTLLM_OUTPUTS, *T.LOGPROB_OUTPUTS,
                                                              *T.DRAFT_OUTPUTS)]
    assert inputs["guided_decoding_guide_type"].data_type == inputs["guided_decoding_guide"].data_type == 13  # STRING
    assert not inputs["input_ids"].optional and inputs["input_ids"].allow_ragged_batch
    assert inputs["request_output_len"].HasField("reshape") and list(inputs["request_output_len"].dims) == [1]
    assert inputs["streaming"].optional and inputs["stop_words_list"].allow_ragged_batch
    names = [t.name for t in configs(target)["ensemble"].output]
    assert len(names) == len(set(names))  # each output once (the upstream template lists one twice)


def test_instance_counts_follow_the_spec_advice() -> None:
    engine, cpu = configs("engine"), configs("cpu")
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        assert engine[name].instance_group[0].count == 16  # max_batch_size 64 clipped to 16
        assert cpu[name].instance_group[0].count == 8  # max_batch_size 8 (at least 5)
    on_two_cores = resolve_options(RepoOptions(), ENGINE_LIMITS, num_cpus=2)  # never more instances than cores
    assert (on_two_cores.preprocessing_instances, on_two_cores.postprocessing_instances,
            on_two_cores.bls_instances) == (2, 2, 2)
    explicit = resolve_options(RepoOptions(preprocessing_instances=2, bls_instances=3), CPU_LIMITS,
                               num_cpus=NUM_CPUS)
    made = repository_configs(CPU_LIMITS, explicit, CPU_LIMITS.model_dir, Path("tokenizer"))
    assert [made[n].instance_group[0].count for n in ("preprocessing", "postprocessing", "tensorrt_llm_bls")] == [
        2, 8, 3]


def test_non_streaming_options_reach_tensorrt_llm_and_bls() -> None:
    options = resolve_options(RepoOptions(decoupled=False, enable_kv_cache_reuse=False, enable_chunked_context=False,
                          batch_scheduler_policy="max_utilization", max_queue_size=7,
                          max_queue_delay_microseconds=250, exclude_input_in_output=False,
                          max_tokens_in_paged_kv_cache=4096), ENGINE_LIMITS, 0.85)
    made = repository_configs(ENGINE_LIMITS, options, Path("/e"), Path("tokenizer"))
    trt, bls = made["tensorrt_llm"], made["tensorrt_llm_bls"]
    params = {k: v.string_value for k, v in trt.parameters.items()}
    assert not trt.model_transaction_policy.decoupled and not bls.model_transaction_policy.decoupled
    assert (params["enable_kv_cache_reuse"], params["enable_chunked_context"], params["exclude_input_in_output"]) == (
        "false", "false", "false")
    assert params["batch_scheduler_policy"] == "max_utilization"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.85"
    assert params["max_tokens_in_paged_kv_cache"] == "4096"
    assert trt.dynamic_batching.max_queue_delay_microseconds == 250
    assert trt.dynamic_batching.default_queue_policy.max_queue_size == 7
    assert made["preprocessing"].dynamic_batching.default_queue_policy.max_queue_size == 0  # only the engine bounds
