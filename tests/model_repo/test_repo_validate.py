"""``validate_repository``: one broken fixture per rule, each with its exact message; clean repositories pass."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from repo_material import write_engine_dir

from trtllm_kit.cli import run
from trtllm_kit.model_repo.configs import parse_config, to_text
from trtllm_kit.model_repo.options import resolve_options
from trtllm_kit.model_repo.repository import write_repository
from trtllm_kit.model_repo.validate import Expectation, validate_repository
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.targets import get_target, limits_from_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, tokenizer_files: list[Path]) -> dict:
    """A clean repository per target; the engine one over a fake engine directory with max_batch_size 16."""
    root = tmp_path_factory.mktemp("repos")
    engine_dir = write_engine_dir(root / "engines")
    repos = {}
    cpu, engine = get_target("cpu").limits(tiny_checkpoint, {}), get_target("engine").limits(engine_dir, {})
    for target, limits in (("cpu", cpu), ("engine", engine)):
        repos[target] = root / target
        write_repository(repos[target], limits, RepoOptions(), model_path=limits.model_dir,
                         tokenizer_files=tokenizer_files)
    return {"repos": repos, "engine_dir": engine_dir, "root": root}


@pytest.fixture
def repo(base: dict, tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    target = getattr(request, "param", "cpu")
    copy = tmp_path / "repo"
    shutil.copytree(base["repos"][target], copy)
    return copy


def edit(repo: Path, model: str, change: Callable) -> None:
    path = repo / model / "config.pbtxt"
    config = parse_config(path.read_text())
    change(config)
    path.write_text(to_text(config))


def set_param(repo: Path, model: str, key: str, value: str) -> None:
    def change(config):
        config.parameters[key].string_value = value
    edit(repo, model, change)


def messages(repo: Path, **kwargs) -> list[tuple[str, str, str, str]]:
    report = validate_repository(repo, read_limits=limits_from_dir, **kwargs)
    return [(f.severity, f.model, f.rule, f.message) for f in report.findings]


@pytest.mark.parametrize("repo", ["cpu", "engine"], indirect=True)
def test_generated_repositories_have_no_findings(repo: Path) -> None:
    assert messages(repo) == []


def test_leftover_typed_placeholder_is_named_with_line_and_column(repo: Path) -> None:
    path = repo / "tensorrt_llm" / "config.pbtxt"
    path.write_text(path.read_text().replace("max_batch_size: 8", "max_batch_size: ${triton_max_batch_size}", 1))
    found = messages(repo)
    assert found[0] == ("error", "tensorrt_llm", "placeholder", "tensorrt_llm/config.pbtxt:2:17 holds the unfilled "
                        "placeholder ${triton_max_batch_size}; regenerate the repository with trtllm-kit build.")
    assert found[1] == ("error", "tensorrt_llm", "parse", "tensorrt_llm/config.pbtxt is not a valid "
                        "inference.ModelConfig (2:17 : 'max_batch_size: ${triton_max_batch_size}': Couldn't parse "
                        "integer: $); fix that line or regenerate the repository.")


def test_leftover_string_placeholder_parses_but_fails(repo: Path) -> None:
    set_param(repo, "postprocessing", "skip_special_tokens", "${skip_special_tokens}")
    line = next(i for i, text in enumerate((repo / "postprocessing" / "config.pbtxt").read_text().splitlines(), 1)
                if "${" in text)
    assert messages(repo) == [("error", "postprocessing", "placeholder", f"postprocessing/config.pbtxt:{line}:20 holds "
                               "the unfilled placeholder ${skip_special_tokens}; regenerate the repository with "
                               "trtllm-kit build.")]


def test_model_name_must_match_its_directory(repo: Path) -> None:
    edit(repo, "postprocessing", lambda c: setattr(c, "name", "detokenizer"))
    assert messages(repo) == [("error", "postprocessing", "name", "postprocessing/config.pbtxt names the model "
                               "'detokenizer' but its directory is 'postprocessing'; Triton refuses the mismatch: "
                               "rename one of them.")]


def test_layout_missing_model_py_model_and_entry_point(repo: Path) -> None:
    (repo / "preprocessing" / "1" / "model.py").unlink()
    shutil.rmtree(repo / "postprocessing")
    shutil.rmtree(repo / "tensorrt_llm_bls")
    (repo / "ensemble" / "config.pbtxt").unlink()
    found = messages(repo)
    assert ("error", "preprocessing", "layout", "preprocessing/1/model.py is missing for the python backend.") in found
    assert ("error", "postprocessing", "layout", "postprocessing/config.pbtxt is missing; every text request needs "
            "it.") in found
    assert ("error", "ensemble", "layout", "neither ensemble nor tensorrt_llm_bls exists; clients have no text entry "
            "point: regenerate the repository.") in found


@pytest.mark.parametrize("repo", ["engine"], indirect=True)
def test_max_batch_size_above_the_engine(repo: Path, base: dict) -> None:
    for model in ("tensorrt_llm", "preprocessing", "postprocessing", "ensemble"):
        edit(repo, model, lambda c: setattr(c, "max_batch_size", 64))
    assert messages(repo)[0] == ("error", "tensorrt_llm", "max_batch_size", "max_batch_size 64 exceeds the engine's "
                                 f"16 ({base['engine_dir']}/config.json); set it to 16.")


def test_ensemble_batch_size_above_a_step(repo: Path) -> None:
    edit(repo, "ensemble", lambda c: setattr(c, "max_batch_size", 9))
    assert messages(repo) == [("error", "ensemble", "max_batch_size", "ensemble max_batch_size 9 exceeds "
                               f"{step}'s 8; Triton refuses that: lower it.")
                              for step in ("preprocessing", "tensorrt_llm", "postprocessing")]


def test_world_size_against_rank_files_manifest_and_gpu_ids(repo: Path, tmp_path: Path) -> None:
    engine_dir = write_engine_dir(tmp_path / "tp2", tp_size=2, num_rank_files=1)
    set_param(repo, "tensorrt_llm", "gpu_device_ids", "0,1,2")
    found = messages(repo, model_dir=engine_dir, expect=Expectation(world_size=1))
    assert found == [
        ("error", "tensorrt_llm", "world_size", f"{engine_dir}/config.json says tp_size 2 × pp_size 1 = 2 ranks but "
         f"{engine_dir} holds 1 rank*.engine file(s); rebuild it."),
        ("error", "tensorrt_llm", "world_size", "the build manifest records tp×pp = 1 but "
         f"{engine_dir}/config.json has world size 2; the repository points at another build: regenerate it."),
        ("error", "tensorrt_llm", "world_size", "gpu_device_ids '0,1,2' lists 3 GPU(s) but the engine needs world "
         "size tp×pp = 2; list exactly that many."),
    ]


def test_chunked_context_and_kv_reuse_need_paged_context_fmha(repo: Path, tmp_path: Path) -> None:
    engine_dir = write_engine_dir(tmp_path / "nofmha", use_paged_context_fmha=False)
    assert messages(repo, model_dir=engine_dir) == [
        ("error", "tensorrt_llm", "paged_context_fmha", f"{key} is true but the engine was built without "
         f"use_paged_context_fmha ({engine_dir}/config.json); set {key} to false or rebuild with "
         "--use_paged_context_fmha enable.") for key in ("enable_chunked_context", "enable_kv_cache_reuse")]


def test_decoupled_must_agree_between_bls_and_tensorrt_llm(repo: Path) -> None:
    edit(repo, "tensorrt_llm_bls", lambda c: setattr(c.model_transaction_policy, "decoupled", False))
    assert messages(repo) == [("error", "tensorrt_llm_bls", "decoupled", "tensorrt_llm_bls has decoupled False but "
                               "tensorrt_llm has decoupled True; streaming needs both true: make them equal.")]


def test_a_decoupled_ensemble_needs_a_decoupled_tensorrt_llm(repo: Path) -> None:
    for model in ("tensorrt_llm", "tensorrt_llm_bls"):
        edit(repo, model, lambda c: setattr(c.model_transaction_policy, "decoupled", False))
    edit(repo, "ensemble", lambda c: setattr(c.model_transaction_policy, "decoupled", True))
    assert messages(repo)[0] == ("error", "ensemble", "decoupled", "ensemble has decoupled True but tensorrt_llm has "
                                 "decoupled False; streaming needs both true: make them equal.")


def test_not_decoupled_warns_that_streaming_is_refused(repo: Path) -> None:
    for model in ("tensorrt_llm", "tensorrt_llm_bls"):
        edit(repo, model, lambda c: setattr(c.model_transaction_policy, "decoupled", False))
    assert messages(repo) == [("warning", "tensorrt_llm", "decoupled", "tensorrt_llm is not decoupled, so requests "
                               "with stream=true are refused; set decoupled = true in [repo] to stream.")]


def test_ensemble_wiring(repo: Path) -> None:
    def change(config):
        pre, trt, post = config.ensemble_scheduling.step
        del pre.input_map["QUERY"]                      # required input left unmapped
        pre.input_map["PROMPT"] = "text_input"          # not an input of preprocessing
        trt.input_map["temperature"] = "top_k"          # INT32 into FP32
        trt.input_map["seed"] = "_NOWHERE"              # read before anything provides it
        post.output_map["TEXT"] = "text_output2"        # not an output of postprocessing
        config.output.add(name="finish_reason", data_type=13, dims=[-1])
    edit(repo, "ensemble", change)
    assert [m[3] for m in messages(repo)] == [
        "step 1 (preprocessing) maps 'text_input' to 'PROMPT', which is not an input of preprocessing; fix input_map.",
        "step 1 leaves the required input preprocessing.QUERY unmapped; add it to input_map.",
        "step 2 (tensorrt_llm) reads '_NOWHERE', which no ensemble input or earlier step provides; fix input_map.",
        "step 2 feeds 'top_k' (TYPE_INT32) into tensorrt_llm.temperature (TYPE_FP32); the types must match.",
        "step 3 maps 'TEXT' to 'text_output2', but postprocessing has no output 'TEXT'; fix output_map.",
        "ensemble output 'finish_reason' is produced by no step; map a step output to it or remove it.",
    ]


def test_ensemble_output_type_and_unknown_step(repo: Path) -> None:
    def change(config):
        config.output[0].data_type = 8  # text_output declared INT32
        config.ensemble_scheduling.step.add(model_name="detokenizer", model_version=-1)
    edit(repo, "ensemble", change)
    assert [m[3] for m in messages(repo)] == [
        "step 4 calls 'detokenizer', which is not in the repository; add it or fix model_name.",
        "ensemble output 'text_output' is declared TYPE_INT32 but its step produces TYPE_STRING; the types must match.",
    ]


def test_tokenizer_files_must_be_present(repo: Path) -> None:
    (repo / "postprocessing" / "tokenizer" / "tokenizer.json").unlink()
    (repo / "postprocessing" / "tokenizer" / "tokenizer_config.json").unlink()
    set_param(repo, "preprocessing", "tokenizer_dir", "/nonexistent/tok")
    assert messages(repo) == [
        ("error", "preprocessing", "tokenizer", "tokenizer_dir '/nonexistent/tok' holds no tokenizer (tokenizer.json, "
         "tokenizer_config.json, tokenizer.model, vocab.json); copy the model's tokenizer there or regenerate."),
        ("error", "postprocessing", "tokenizer", "tokenizer_dir 'tokenizer' holds no tokenizer (tokenizer.json, "
         "tokenizer_config.json, tokenizer.model, vocab.json); copy the model's tokenizer there or regenerate."),
    ]


def test_tokenizer_must_fit_the_model_vocabulary(repo: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    small = tmp_path / "small-vocab"
    shutil.copytree(tiny_checkpoint, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 512}))
    assert messages(repo, model_dir=small) == [
        ("error", name, "tokenizer", f"tokenizer_dir 'tokenizer' has 1024 tokens but the model's vocabulary has 512 "
         f"({small}/config.json); the tokenizer belongs to another model: copy the right one or regenerate.")
        for name in ("preprocessing", "postprocessing")]


def test_model_path_must_exist(repo: Path) -> None:
    set_param(repo, "tensorrt_llm", "gpt_model_path", "/nonexistent/engines")
    assert messages(repo) == [("error", "tensorrt_llm", "gpt_model_path", "gpt_model_path '/nonexistent/engines' has "
                               "no config.json; point it at the engine (or, for the cpu target, checkpoint) "
                               "directory.")]


def test_kv_fraction_against_the_plan_and_range(repo: Path) -> None:
    assert messages(repo, expect=Expectation(kv_cache_fraction=0.8)) == [
        ("error", "tensorrt_llm", "kv_cache", "kv_cache_free_gpu_mem_fraction 0.9 differs from the build plan's "
         "kv_cache_fraction 0.8, which sized max_batch_size; set them equal.")]
    set_param(repo, "tensorrt_llm", "kv_cache_free_gpu_mem_fraction", "1.5")
    assert messages(repo) == [("error", "tensorrt_llm", "kv_cache", "kv_cache_free_gpu_mem_fraction is '1.5'; it "
                               "must be a number in (0, 1].")]


def test_kv_pool_below_one_full_sequence(repo: Path) -> None:
    set_param(repo, "tensorrt_llm", "max_tokens_in_paged_kv_cache", "512")
    assert messages(repo) == [("error", "tensorrt_llm", "kv_cache", "max_tokens_in_paged_kv_cache 512 is below the "
                               "engine's max_seq_len 1024, so one full-length sequence cannot fit; raise it.")]


def test_batching_strategy(repo: Path) -> None:
    set_param(repo, "tensorrt_llm", "gpt_model_type", "inflight")
    assert messages(repo) == [("error", "tensorrt_llm", "gpt_model_type", "gpt_model_type is 'inflight'; the backend "
                               "requires one of V1, inflight_batching, inflight_fused_batching (use "
                               "inflight_fused_batching).")]
    set_param(repo, "tensorrt_llm", "gpt_model_type", "V1")
    assert messages(repo) == [("warning", "tensorrt_llm", "gpt_model_type", "gpt_model_type is V1; in-flight fused "
                               "batching serves far more requests per second: use inflight_fused_batching.")]


def test_beam_width_above_the_engine(repo: Path) -> None:
    set_param(repo, "tensorrt_llm", "max_beam_width", "4")
    assert messages(repo) == [("error", "tensorrt_llm", "max_beam_width", "max_beam_width 4 exceeds the engine's 1; "
                               "lower it or rebuild with a larger --max_beam_width.")]


def test_single_instances_warn(repo: Path) -> None:
    edit(repo, "postprocessing", lambda c: setattr(c.instance_group[0], "count", 1))
    assert messages(repo) == [("warning", "postprocessing", "instances", "postprocessing has 1 instance, which "
                               "serialises every request's text work; use about 5 or the engine's max_batch_size.")]


def test_the_artifact_next_to_the_repository_is_read(tmp_path: Path) -> None:
    out = tmp_path / "out"  # a real build with a plan (for an L4), whose KV fraction the repository must keep
    assert run(["build", "builtin:tiny-llama", "--tp", "2", "--no-verify", "--gpu", "L4", "--kv-cache-fraction",
                "0.8", "--max-seq-len", "128", "--out", str(out)]) == 0
    assert Expectation.of_artifact(out) == Expectation(world_size=2, kv_cache_fraction=0.8)
    assert validate_repository(out / "repo", read_limits=limits_from_dir).errors == []
    set_param(out / "repo", "tensorrt_llm", "kv_cache_free_gpu_mem_fraction", "0.5")
    assert [f.message for f in validate_repository(out / "repo", read_limits=limits_from_dir).errors] == [
        "kv_cache_free_gpu_mem_fraction 0.5 differs from the build plan's kv_cache_fraction 0.8, which sized "
        "max_batch_size; set them equal."]
    (out / "manifest.json").write_text("{")  # an unreadable manifest: nothing is expected, nothing crashes
    assert validate_repository(out / "repo", read_limits=limits_from_dir).errors == []


def test_options_resolution_refuses_what_the_engine_cannot_do(tmp_path: Path) -> None:
    from trtllm_kit.errors import KitUsageError

    limits = get_target("engine").limits(write_engine_dir(tmp_path / "e", use_paged_context_fmha=False), {})
    assert resolve_options(RepoOptions(), limits).enable_kv_cache_reuse is False
    with pytest.raises(KitUsageError, match=r"^enable_kv_cache_reuse needs an engine built with use_paged_"):
        resolve_options(RepoOptions(enable_kv_cache_reuse=True), limits)
    with pytest.raises(KitUsageError, match=r"^kv_cache_free_gpu_mem_fraction 0.5 differs from the build plan's "
                       r"kv_cache_fraction 0.9, which sized max_batch_size; set them equal.$"):
        resolve_options(RepoOptions(kv_cache_free_gpu_mem_fraction=0.5), limits, 0.9)
    with pytest.raises(KitUsageError, match=r"^max_tokens_in_paged_kv_cache 100 is below max_seq_len 1024"):
        resolve_options(RepoOptions(max_tokens_in_paged_kv_cache=100), replace(limits, use_paged_context_fmha=True))
    with pytest.raises(KitUsageError, match=r"^batch_scheduler_policy 'fifo' is not one of guaranteed_no_evict, "
                       r"max_utilization.$"):
        RepoOptions(batch_scheduler_policy="fifo")


def test_a_model_without_tokenizer_gets_a_token_id_repository(tmp_path: Path, tiny_checkpoint: Path) -> None:
    (tmp_path / "generation_config.json").write_text("{}")
    summary = write_repository(tmp_path / "repo", get_target("cpu").limits(tiny_checkpoint, {}), RepoOptions(),
                               model_path=tiny_checkpoint, tokenizer_files=[tmp_path / "generation_config.json"])
    assert (summary.models, summary.text) == (["tensorrt_llm"], False)
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["tensorrt_llm"]
    assert messages(tmp_path / "repo") == [("warning", "tensorrt_llm", "layout", "the repository has only "
                                            "tensorrt_llm (the model had no tokenizer), so clients send token ids; "
                                            "rebuild from a model with tokenizer files for text.")]
