"""``build --target engine --speculative draft-target``: the draft's checkpoint and engine (its own trtllm-build argv),
the manifest's record of both engines, the repository in upstream's spec_decode layout (TensorRT-LLM 1.2.1,
``triton_backend/all_models/inflight_batcher_llm`` and ``examples/draft_target_model/README.md``), the plan's draft
figures against what is built, and serve's refusal of an artifact whose draft engine is missing.

``trtllm-build`` cannot run here: the fake of ``tests/build/fakes.py`` records its argv and writes an engine
directory; the machine is a faked H100 host."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from speculative_engine_build import FAKES, LIMITS, flag_values, install_fake_build

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.records import EngineRecord
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.safetensors_io import read_header
from trtllm_kit.serve.servable import servable
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions

DRAFT_LEN = 3
ENGINE_FLAGS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
                "tokens_per_block", "kv_cache_type", "use_paged_context_fmha", "gpt_attention_plugin")
# upstream's tensorrt_llm_bls/config.pbtxt: the speculation inputs (name → type, dims, reshaped to a scalar) and the
# parameters that name the target and draft models
UPSTREAM_BLS_DRAFT_INPUTS = {"num_draft_tokens": ("TYPE_INT32", [1], False),
                             "use_draft_logits": ("TYPE_BOOL", [1], True)}
UPSTREAM_BLS_DRAFT_OUTPUTS = {"acceptance_rate": "TYPE_FP32", "total_accepted_draft_tokens": "TYPE_INT32",
                              "total_draft_tokens": "TYPE_INT32"}
# upstream's tensorrt_llm/config.pbtxt: the target's draft inputs (name → type, dims)
UPSTREAM_TARGET_DRAFT_INPUTS = {"draft_input_ids": ("TYPE_INT32", [-1]), "draft_logits": ("TYPE_FP32", [-1, -1]),
                                "draft_acceptance_threshold": ("TYPE_FP32", [1])}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One draft-target build on the faked H100 host: its output and the trtllm-build calls."""
    root = tmp_path_factory.mktemp("spec-decode")
    with pytest.MonkeyPatch.context() as patch:
        install_fake_build(root, patch)
        out = root / "out"
        code = run(["build", "builtin:tiny-llama", "--no-verify", *LIMITS, "--out", str(out), "--speculative",
                    "draft-target", "--draft-model", str(builtin_dir("tiny-llama")), "--max-draft-len",
                    str(DRAFT_LEN)])
        assert code == 0
        calls = [json.loads(line)["argv"] for line in (root / "argv.jsonl").read_text().splitlines()]
        yield {"out": out, "calls": calls, "machine": FAKES.h100_machine()}


def params(config: Any) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def read(out: Path, model: str) -> Any:
    return parse_config((out / "repo" / model / "config.pbtxt").read_text())


def test_the_draft_engine_is_built_after_the_target_with_its_own_argv(built: dict[str, Any]) -> None:
    target, draft = built["calls"]
    target_flags, draft_flags = flag_values(target), flag_values(draft)
    assert (target_flags["checkpoint_dir"], target_flags["output_dir"]) == ("checkpoint", "engines")
    assert target_flags["speculative_decoding_mode"] == "draft_tokens_external"
    assert target_flags["max_draft_len"] == str(DRAFT_LEN)
    assert (draft_flags["checkpoint_dir"], draft_flags["output_dir"]) == ("draft_checkpoint", "draft_engines")
    assert "--speculative_decoding_mode" not in draft and "--max_draft_len" not in draft
    assert "--gather_generation_logits" not in draft  # no draft logits asked for
    assert {k: draft_flags[k] for k in ENGINE_FLAGS} == {k: target_flags[k] for k in ENGINE_FLAGS}
    assert draft_flags["workers"] == "1"
    checkpoint = json.loads((built["out"] / "draft_checkpoint" / "config.json").read_text())
    target_checkpoint = json.loads((built["out"] / "checkpoint" / "config.json").read_text())
    assert checkpoint["mapping"]["world_size"] == 1 and checkpoint["dtype"] == target_checkpoint["dtype"]
    assert checkpoint["quantization"]["quant_algo"] is None


def test_the_manifest_records_both_engines_and_their_versions(built: dict[str, Any]) -> None:
    out = built["out"]
    engine = json.loads((out / "manifest.json").read_text())["summary"]["engine"]
    assert engine["command"] == ["trtllm-build", *built["calls"][0]]
    assert engine["draft_command"] == ["trtllm-build", *built["calls"][1]]
    draft = engine["draft"]
    assert (draft["dir"], draft["world_size"], draft["tp_size"], draft["pp_size"]) == ("draft_engines", 1, 1, 1)
    assert (draft["tensorrt_llm"], draft["tensorrt"], draft["gpu"]) == ("1.2.1", "10.14.1.48", "NVIDIA H100 80GB HBM3")
    assert draft["effective"]["max_batch_size"] == engine["effective"]["max_batch_size"] == 4
    record = Artifact.read(out).records.engine
    assert record is not None and record.draft is not None and record.draft.dir == "draft_engines"
    assert EngineRecord.from_dict(record.to_dict()) == record


def test_the_repository_has_upstreams_spec_decode_layout(built: dict[str, Any]) -> None:
    out = built["out"]
    models = sorted(p.name for p in (out / "repo").iterdir() if (p / "config.pbtxt").is_file())
    assert models == ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls",
                      "tensorrt_llm_draft"]
    target, draft = read(out, "tensorrt_llm"), read(out, "tensorrt_llm_draft")
    assert (draft.name, draft.backend, draft.max_batch_size) == ("tensorrt_llm_draft", "tensorrtllm", 4)
    assert params(draft)["gpt_model_path"] == str(out.absolute() / "draft_engines")
    assert params(target)["gpt_model_path"] == str(out.absolute() / "engines")
    guided = ("guided_decoding_backend", "xgrammar_tokenizer_info_path")
    same = {k: v for k, v in params(target).items() if k not in ("gpt_model_path", *guided)}
    assert {k: v for k, v in params(draft).items() if k != "gpt_model_path"} == same
    assert list(draft.input) == list(target.input) and list(draft.output) == list(target.output)
    inputs = {t.name: t for t in target.input}
    for name, (data_type, dims) in UPSTREAM_TARGET_DRAFT_INPUTS.items():
        assert (f"TYPE_{_type(inputs[name].data_type)}", list(inputs[name].dims), inputs[name].optional) == (
            data_type, dims, True), name


def test_the_bls_names_both_models_and_takes_the_draft_inputs(built: dict[str, Any]) -> None:
    bls = read(built["out"], "tensorrt_llm_bls")
    assert {k: params(bls)[k] for k in ("tensorrt_llm_model_name", "tensorrt_llm_draft_model_name")} == {
        "tensorrt_llm_model_name": "tensorrt_llm", "tensorrt_llm_draft_model_name": "tensorrt_llm_draft"}
    inputs = {t.name: t for t in bls.input}
    for name, (data_type, dims, reshaped) in UPSTREAM_BLS_DRAFT_INPUTS.items():
        tensor = inputs[name]
        assert (f"TYPE_{_type(tensor.data_type)}", list(tensor.dims), tensor.optional,
                tensor.HasField("reshape")) == (data_type, dims, True, reshaped), name
    outputs = {t.name: f"TYPE_{_type(t.data_type)}" for t in bls.output}
    assert {k: outputs[k] for k in UPSTREAM_BLS_DRAFT_OUTPUTS} == UPSTREAM_BLS_DRAFT_OUTPUTS


def test_the_ensemble_routes_through_the_bls(built: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    out = built["out"]
    ensemble, bls = read(out, "ensemble"), read(out, "tensorrt_llm_bls")
    [step] = ensemble.ensemble_scheduling.step
    assert step.model_name == "tensorrt_llm_bls"
    assert dict(step.input_map) == {t.name: t.name for t in ensemble.input}
    assert {"num_draft_tokens", "use_draft_logits"} <= set(step.input_map)
    assert dict(step.output_map) == {t.name: t.name for t in ensemble.output}
    assert set(step.output_map) <= {t.name for t in bls.output}
    capsys.readouterr()
    assert run(["validate", str(out), "--json"]) == 0
    assert [f for f in json.loads(capsys.readouterr().out)["findings"] if f["severity"] == "error"] == []


def test_the_plan_counts_the_draft_that_is_built(built: dict[str, Any]) -> None:
    out = built["out"]
    plan = json.loads((out / "manifest.json").read_text())["summary"]["engine"]["plan"]
    [rank] = plan["ranks"]
    target_bytes = sum(_tensor_bytes(p) for p in (out / "checkpoint").glob("rank*.safetensors"))
    draft_bytes = _tensor_bytes(out / "draft_checkpoint" / "rank0.safetensors")
    draft_hf = read_hf_config(builtin_dir("tiny-llama"))
    assert draft_bytes == draft_hf.num_parameters * 2  # bfloat16, whole
    assert rank["weight_bytes"] - target_bytes == draft_bytes
    kv = 2 * draft_hf.num_hidden_layers * draft_hf.num_key_value_heads * draft_hf.head_dim * 2
    assert rank["kv_bytes_per_token"] == 2 * kv  # the target's and the draft's, both bfloat16 here


def test_an_int8_kv_target_plans_its_draft_kv_in_the_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The draft engine is unquantized: its KV cache is the dtype's, whatever the target's KV precision."""
    assert run(["plan", "builtin:tiny-llama", "--target", "engine", "--gpu", "H100-80GB", *LIMITS, "--kv-cache",
                "int8", "--out", str(tmp_path / "out"), "--speculative", "draft-target", "--draft-model",
                str(builtin_dir("tiny-llama")), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    hf = read_hf_config(builtin_dir("tiny-llama"))
    per_layer = 2 * hf.num_key_value_heads * hf.head_dim
    assert report["plan"]["ranks"][0]["kv_bytes_per_token"] == hf.num_hidden_layers * per_layer * (1 + 2)
    assert flag_values(report["draft_command"])["output_dir"] == "draft_engines"


def test_draft_logits_build_the_draft_with_generation_logits(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "trtllm-kit.toml"
    config.write_text(f'[speculative]\nmode = "draft-target"\ndraft_model = "{builtin_dir("tiny-llama")}"\n'
                      "draft_logits = true\n")
    assert run(["build", "builtin:tiny-llama", "--config", str(config), "--target", "engine", "--gpu", "H100-80GB",
                "--out", str(tmp_path / "out"), "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["draft_command"][-1] == "--gather_generation_logits"
    assert "--gather_generation_logits" not in report["commands"][0]


def test_draft_logits_without_draft_target_are_refused() -> None:
    with pytest.raises(KitUsageError, match=r"^\[speculative\] draft_logits applies to draft-target only, got mode "
                       r"lookahead; drop it\.$"):
        SpeculativeOptions(mode=Speculation.LOOKAHEAD, draft_logits=True)


def test_serve_refuses_an_artifact_whose_draft_engine_is_missing(built: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(built["out"], out, symlinks=True)
    (out / "draft_engines" / "rank0.engine").unlink()
    with pytest.raises(KitUsageError) as refused:
        servable(out, built["machine"])
    assert str(refused.value) == (
        f"{out} cannot be served here: its draft engine draft_engines/ lacks rank0.engine, which draft-target "
        f"speculation serves; rebuild it on this machine (trtllm-kit build ... --out {out} --force) or serve it "
        "where it was built.")


def _type(value: int) -> str:
    from tritonclient.grpc import model_config_pb2 as mc

    return mc.DataType.Name(value).removeprefix("TYPE_")


def _tensor_bytes(path: Path) -> int:
    header = read_header(path)
    return sum(end - start for name, entry in header.items() if name != "__metadata__"
               for start, end in [entry["data_offsets"]])


def test_a_rebuild_reuses_both_engines(built: dict[str, Any], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(built["out"], out, symlinks=True)
    with pytest.MonkeyPatch.context() as patch:
        install_fake_build(tmp_path, patch)
        assert run(["build", "builtin:tiny-llama", "--no-verify", *LIMITS, "--out", str(out), "--speculative",
                    "draft-target", "--draft-model", str(builtin_dir("tiny-llama")), "--max-draft-len",
                    str(DRAFT_LEN)]) == 0
    assert not (tmp_path / "argv.jsonl").exists()  # trtllm-build did not run
    assert "engine: unchanged" in capsys.readouterr().err
    record, first = Artifact.read(out).records.engine, Artifact.read(built["out"]).records.engine
    assert record is not None and first is not None and record.draft == first.draft
    assert (out / "draft_engines" / "rank0.engine").read_bytes() == (
        built["out"] / "draft_engines" / "rank0.engine").read_bytes()


def test_a_sharded_target_with_a_draft_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "builtin:tiny-llama", "--target", "engine", "--gpu", "H100-80GB", "--tp", "2", "--out",
                str(tmp_path / "out"), "--speculative", "draft-target", "--draft-model",
                str(builtin_dir("tiny-llama"))]) != 0
    assert ("Error: --speculative draft-target on the engine target needs --tp 1 --pp 1 (its draft engine runs whole "
            "beside a one-rank target), got tp 2 pp 1; build with --tp 1 --pp 1 or with --target llmapi.") in \
        capsys.readouterr().err
