"""``build --target engine --speculative medusa --draft-model HEADS``: the heads checkpoint checked before any work,
the heads written into every rank file as upstream's converter lays them out (TensorRT-LLM 1.2.1
``tensorrt_llm/models/medusa/weight.py`` ``load_medusa_hf``: ``medusa_heads.{h}.medusa_layers.{l}.linear.*`` and
``medusa_heads.{h}.lm_head.weight`` split along dim 0, the lm_head over the padded vocabulary), ``config.json`` as
``MedusaConfig.to_dict`` writes it, trtllm-build's ``--speculative_decoding_mode medusa``, the ``tensorrt_llm``
model's ``decoding_mode``/``medusa_choices``, the plan's count of the heads and the manifest's record.

``trtllm-build`` cannot run here: the fake of ``tests/build/fakes.py`` records its argv; the machine is a faked H100
host."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from speculative_engine_build import (
    FAKES,
    LIMITS,
    UPSTREAM_DECODING_MODES,
    UPSTREAM_MODES,
    assert_refused_before_any_work,
    fake_gpu_host,
    flag_values,
    install_fake_build,
)

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.records import EngineRecord
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.mapping import pad_vocab_size
from trtllm_kit.model_repo.configs import BACKEND_DEFAULT_KEYS, parse_config
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.safetensors_io import read_header
from trtllm_kit.serve.servable import servable

BASE = read_hf_config(builtin_dir("tiny-llama"))
NUM_HEADS, NUM_LAYERS, DRAFT_LEN = 3, 2, 3


def make_heads(path: Path, *, num_heads: int = NUM_HEADS, num_layers: int = NUM_LAYERS, hidden: int | None = None,
               vocab: int | None = None, config: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """A Medusa heads checkpoint as FasterDecoding/Medusa saves it: config.json and medusa_lm_head.safetensors."""
    hidden, vocab = hidden or BASE.hidden_size, vocab or BASE.vocab_size
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            tensors[f"{head}.{layer}.linear.weight"] = torch.randn(hidden, hidden, generator=generator) * 0.02
            tensors[f"{head}.{layer}.linear.bias"] = torch.randn(hidden, generator=generator) * 0.02
        tensors[f"{head}.{num_layers}.weight"] = torch.randn(vocab, hidden, generator=generator) * 0.02
    path.mkdir(parents=True)
    save_file(tensors, str(path / "medusa_lm_head.safetensors"))
    values = config if config is not None else {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
                                                "base_model_name_or_path": "tiny-llama"}
    (path / "config.json").write_text(json.dumps(values))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One Medusa build at tp 2 on the faked H100 host (verified on the CPU): its output, heads and trtllm-build
    calls."""
    root = tmp_path_factory.mktemp("medusa")
    heads = make_heads(root / "heads")
    with pytest.MonkeyPatch.context() as patch:
        machine = install_fake_build(root, patch)
        out = root / "out"
        assert run(["build", "builtin:tiny-llama", "--tp", "2", *LIMITS, "--out", str(out), "--speculative",
                    "medusa", "--draft-model", str(heads), "--max-draft-len", str(DRAFT_LEN)]) == 0
        [argv] = [json.loads(line)["argv"] for line in (root / "argv.jsonl").read_text().splitlines()]
        yield {"out": out, "heads": heads, "argv": argv, "machine": machine}


def test_trtllm_build_is_asked_for_a_medusa_engine(built: dict[str, Any]) -> None:
    flags = flag_values(built["argv"])
    assert flags["speculative_decoding_mode"] == "medusa" and flags["speculative_decoding_mode"] in UPSTREAM_MODES
    assert flags["max_draft_len"] == str(DRAFT_LEN)
    assert flags["checkpoint_dir"] == "checkpoint"


def test_the_checkpoint_config_is_upstreams_medusa_config(built: dict[str, Any]) -> None:
    config = json.loads((built["out"] / "checkpoint" / "config.json").read_text())
    assert config["architecture"] == "MedusaForCausalLM"
    assert (config["num_medusa_heads"], config["num_medusa_layers"], config["max_draft_len"]) == (
        NUM_HEADS, NUM_LAYERS, DRAFT_LEN)
    assert (config["hidden_size"], config["vocab_size"]) == (BASE.hidden_size, BASE.vocab_size)  # the base's keys


def test_every_rank_holds_its_slice_of_every_head(built: dict[str, Any]) -> None:
    source = load_file(str(built["heads"] / "medusa_lm_head.safetensors"))
    padded = pad_vocab_size(BASE.vocab_size, 2)  # 1031 → 1032: one zero row on rank 1
    for rank in range(2):
        tensors = load_file(str(built["out"] / "checkpoint" / f"rank{rank}.safetensors"))
        assert "transformer.layers.0.attention.qkv.weight" in tensors  # the base beside the heads
        for head in range(NUM_HEADS):
            for layer in range(NUM_LAYERS):
                prefix = f"medusa_heads.{head}.medusa_layers.{layer}.linear"
                rows = slice(rank * BASE.hidden_size // 2, (rank + 1) * BASE.hidden_size // 2)
                expected = source[f"{head}.{layer}.linear.weight"].to(torch.bfloat16)[rows]
                assert torch.equal(tensors[f"{prefix}.weight"], expected)
                assert torch.equal(tensors[f"{prefix}.bias"], source[f"{head}.{layer}.linear.bias"]
                                   .to(torch.bfloat16)[rows])
            lm_head = torch.cat([source[f"{head}.{NUM_LAYERS}.weight"], torch.zeros(1, BASE.hidden_size)])
            part = lm_head.to(torch.bfloat16)[rank * padded // 2:(rank + 1) * padded // 2]
            assert torch.equal(tensors[f"medusa_heads.{head}.lm_head.weight"], part)


def test_the_tensorrt_llm_model_decodes_with_the_medusa_tree(built: dict[str, Any]) -> None:
    config = parse_config((built["out"] / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    values = {k: v.string_value for k, v in config.parameters.items()}
    assert values["decoding_mode"] == "medusa" and values["decoding_mode"] in UPSTREAM_DECODING_MODES
    # the backend's spelling (docs/model_config.md: "{0, 0, 0}, {0, 1}"): the top-1 path through the first 3 heads
    assert values["medusa_choices"] == "{0}, {0, 0}, {0, 0, 0}"
    assert "medusa_choices" in BACKEND_DEFAULT_KEYS  # the backend's own name for it


def test_the_plan_counts_the_heads_that_are_written(built: dict[str, Any]) -> None:
    out = built["out"]
    plan = json.loads((out / "manifest.json").read_text())["summary"]["engine"]["plan"]
    for rank in range(2):
        header = read_header(out / "checkpoint" / f"rank{rank}.safetensors")
        heads = sum(end - start for name, entry in header.items() if name.startswith("medusa_heads.")
                    for start, end in [entry["data_offsets"]])
        per_layer = (BASE.hidden_size * BASE.hidden_size + BASE.hidden_size) // 2
        assert heads == NUM_HEADS * (NUM_LAYERS * per_layer + 1032 // 2 * BASE.hidden_size) * 2  # bfloat16
        base = sum(end - start for name, entry in header.items() if name != "__metadata__"
                   and not name.startswith("medusa_heads.") for start, end in [entry["data_offsets"]])
        assert plan["ranks"][rank]["weight_bytes"] == base + heads


def test_the_manifest_records_the_heads(built: dict[str, Any]) -> None:
    record = Artifact.read(built["out"]).records.engine
    assert record is not None and record.heads == {"kind": "medusa", "source": str(built["heads"]),
                                                   "num_heads": NUM_HEADS, "num_layers": NUM_LAYERS}
    assert EngineRecord.from_dict(record.to_dict()) == record
    spec = json.loads((built["out"] / "manifest.json").read_text())["spec"]["speculative"]
    assert (spec["mode"], spec["draft_model"], spec["max_draft_len"]) == ("medusa", str(built["heads"]), DRAFT_LEN)


def test_serve_on_a_cpu_machine_refuses_the_medusa_engine(built: dict[str, Any]) -> None:
    cpu = FAKES.h100_machine(num_gpus=0)
    with pytest.raises(KitUsageError) as refused:
        servable(built["out"], cpu)
    out = built["out"]
    assert str(refused.value) == (
        f"{out} cannot be served here: the engines need 2 GPU(s) of compute capability 9.0, none is visible; rebuild "
        f"it on this machine (trtllm-kit build ... --out {out} --force) or serve it where it was built.")


def test_a_rebuild_with_another_draft_length_converts_again(built: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(built["out"], out, symlinks=True)
    with pytest.MonkeyPatch.context() as patch:
        install_fake_build(tmp_path, patch)
        assert run(["build", "builtin:tiny-llama", "--tp", "2", *LIMITS, "--out", str(out),
                    "--speculative", "medusa", "--draft-model", str(built["heads"]), "--max-draft-len", "2"]) == 0
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert (config["architecture"], config["max_draft_len"]) == ("MedusaForCausalLM", 2)
    repo = parse_config((out / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    assert repo.parameters["medusa_choices"].string_value == "{0}, {0, 0}"


def dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    assert run(["build", "builtin:tiny-llama", "--out", str(tmp_path / "out"), "--target", "engine", "--gpu",
                "H100-80GB", "--dry-run", "--json", *flags]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_the_default_draft_length_and_the_toml_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heads = make_heads(tmp_path / "heads", num_heads=4, num_layers=1)
    config = tmp_path / "trtllm-kit.toml"
    config.write_text(f'[speculative]\nmode = "medusa"\ndraft_model = "{heads}"\n')
    flags = flag_values(dry_run(tmp_path, capsys, "--config", str(config))["commands"][0])
    assert (flags["speculative_decoding_mode"], flags["max_draft_len"]) == ("medusa", "4")


def test_the_plan_grows_by_the_heads_on_each_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heads = make_heads(tmp_path / "heads", num_heads=2, num_layers=1)
    for tp in ("1", "2"):
        plain = dry_run(tmp_path, capsys, "--tp", tp)["plan"]["ranks"][0]["weight_bytes"]
        medusa = dry_run(tmp_path, capsys, "--tp", tp, "--speculative", "medusa", "--draft-model", str(heads),
                         "--max-draft-len", "2")["plan"]["ranks"][0]["weight_bytes"]
        size = int(tp)
        per_head = (BASE.hidden_size ** 2 + BASE.hidden_size) // size \
            + pad_vocab_size(BASE.vocab_size, size) // size * BASE.hidden_size
        assert medusa - plain == 2 * per_head * 2  # two heads, bfloat16


def _refusals(tmp: Path) -> list[tuple[list[str], str]]:
    good = make_heads(tmp / "good")
    pickle_only = make_heads(tmp / "pickle")
    (pickle_only / "medusa_lm_head.safetensors").rename(pickle_only / "medusa_lm_head.pt")
    no_config = make_heads(tmp / "no-config")
    (no_config / "config.json").unlink()
    missing = make_heads(tmp / "missing", config={"medusa_num_heads": NUM_HEADS + 1, "medusa_num_layers": NUM_LAYERS})
    wide = make_heads(tmp / "wide", hidden=BASE.hidden_size * 2)
    other_vocab = make_heads(tmp / "vocab", vocab=BASE.vocab_size + 5)
    not_medusa = make_heads(tmp / "not-medusa", config={"architectures": ["LlamaForCausalLM"]})
    what = "pass the directory holding config.json (with medusa_num_heads) and medusa_lm_head.safetensors"
    heads_file = "medusa_lm_head.safetensors"
    return [
        (["--draft-model", str(no_config)],
         f"Error: --draft-model {no_config} has no config.json, so it is not a Medusa heads checkpoint; {what}."),
        (["--draft-model", str(not_medusa)],
         f"Error: --draft-model {not_medusa}/config.json has medusa_num_heads None and medusa_num_layers 1, so it is "
         f"not a Medusa heads checkpoint; {what}."),
        (["--draft-model", str(pickle_only)],
         f"Error: --draft-model {pickle_only} has only medusa_lm_head.pt, a pickle the kit does not load; save the "
         "heads as medusa_lm_head.safetensors."),
        (["--draft-model", str(missing)],
         f"Error: --draft-model {missing}/{heads_file} lacks the tensor '3.0.linear.weight' that medusa_num_heads 4 "
         "and medusa_num_layers 2 imply; pass a complete Medusa heads checkpoint."),
        (["--draft-model", str(wide)],
         f"Error: --draft-model {wide}/{heads_file} has 0.0.linear.weight of shape [512, 512], heads of hidden size "
         "512 where the base has 256; use heads trained on this base model."),
        (["--draft-model", str(other_vocab)],
         f"Error: --draft-model {other_vocab}/{heads_file} has 0.2.weight of shape [1036, 256], heads predicting 1036 "
         "tokens where the base's vocabulary has 1031; use heads trained on this base model."),
        (["--draft-model", str(good), "--max-draft-len", "4"],
         f"Error: --max-draft-len 4 exceeds the 3 heads of --draft-model {good} (the tree takes one token per head); "
         "pass --max-draft-len 3 or less."),
        (["--draft-model", str(tmp / "absent")],
         f"Error: --draft-model {tmp / 'absent'} is not a directory; pass a Medusa heads checkpoint directory."),
        ([], "Error: --speculative medusa needs --draft-model DIR (a Medusa heads checkpoint directory); none was "
             "given."),
        (["--draft-model", str(good), "--max-draft-len", "3", "--quant", "int8-wo"],
         "Error: --speculative medusa builds the heads unquantized, but the weights' quant_algo is W8A16; build with "
         "--quant none (--kv-cache may stay quantized)."),
    ]


@pytest.mark.parametrize("command", [["build"], ["plan"], ["build", "--dry-run"]])
def test_a_heads_directory_that_is_not_one_is_refused_before_any_work(command: list[str], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu_host(monkeypatch)
    assert_refused_before_any_work(command, "medusa", _refusals(tmp_path / "heads"), tmp_path / "out",
                                   lambda: capsys.readouterr().err)


@pytest.mark.parametrize(("flags", "message"), [
    (["builtin:tiny-llama", "--target", "llmapi"],
     "Error: --speculative medusa is not available on the llmapi target; build with --target engine."),
    (["builtin:tiny-llama", "--target", "cpu"],
     "Error: --speculative medusa is not available on the cpu target; build with --target engine."),
    (["builtin:tiny-qwen2", "--target", "engine"],
     "Error: --speculative medusa needs a base of architecture LlamaForCausalLM (TensorRT-LLM's MedusaForCausalLM), "
     "got Qwen2ForCausalLM; use --speculative draft-target or lookahead."),
])
def test_medusa_is_refused_where_it_cannot_build(flags: list[str], message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    heads = make_heads(tmp_path / "heads")
    assert run(["build", *flags, "--out", str(tmp_path / "out"), "--gpu", "H100-80GB", "--dry-run",
                "--speculative", "medusa", "--draft-model", str(heads), "--max-draft-len", str(DRAFT_LEN)]) != 0
    assert message in capsys.readouterr().err
