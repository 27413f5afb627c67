"""``build --speculative``: the engine target's trtllm-build argv (upstream's ``--speculative_decoding_mode`` and
``--max_draft_len``), the refusals a build makes (target, MTP layers, the draft's tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir

ENGINE = ["--target", "engine", "--gpu", "H100-80GB", "--dry-run", "--json"]


def dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> list[str]:
    assert run(["build", "builtin:tiny-llama", "--out", str(tmp_path / "out"), *ENGINE, *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    [argv] = report["commands"]
    return list(argv)


def flag_values(argv: list[str]) -> dict[str, str]:
    return {argv[i][2:]: argv[i + 1] for i in range(1, len(argv) - 1) if argv[i].startswith("--")
            and not argv[i + 1].startswith("--")}


def test_lookahead_builds_the_engine_for_lookahead_decoding(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    flags = flag_values(dry_run(tmp_path, capsys, "--speculative", "lookahead"))
    assert flags["speculative_decoding_mode"] == "lookahead_decoding"
    assert flags["max_draft_len"] == "15"  # (N - 2) + (W - 1 + G)(N - 1) at W=4, N=3, G=4


def test_draft_target_builds_the_target_engine_for_external_drafts(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    draft = builtin_dir("tiny-qwen2")
    flags = flag_values(dry_run(tmp_path, capsys, "--speculative", "draft-target", "--draft-model", str(draft),
                                "--max-draft-len", "6"))
    assert flags["speculative_decoding_mode"] == "draft_tokens_external"
    assert flags["max_draft_len"] == "6"


def test_without_speculation_the_argv_has_no_speculative_flags(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    flags = flag_values(dry_run(tmp_path, capsys))
    assert "speculative_decoding_mode" not in flags and "max_draft_len" not in flags


@pytest.mark.parametrize(("flags", "message"), [
    (["--target", "engine", "--speculative", "ngram"],
     "Error: --speculative ngram is not available on the engine target; build with --target llmapi or cpu."),
    (["--target", "llmapi", "--speculative", "mtp"],
     "Error: --speculative mtp needs a model whose config.json carries MTP layers (num_nextn_predict_layers >= 1), "
     "got 0; use --speculative ngram or draft-target."),
    (["--target", "engine", "--build-flag", "speculative_decoding_mode=medusa"],
     "Error: --build-flag speculative_decoding_mode is set from --speculative and the memory plan; it cannot be "
     "overridden."),
])
def test_refused_builds(flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["build", "builtin:tiny-llama", "--out", str(tmp_path / "out"), "--gpu", "H100-80GB", "--dry-run",
                *flags]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", [["build"], ["plan"], ["build", "--dry-run"]])
def test_a_draft_with_another_tokenizer_is_refused_before_any_work(command: list[str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    draft = tmp_path / "draft"
    shutil.copytree(builtin_dir("tiny-llama"), draft)
    (draft / "tokenizer_config.json").chmod(0o644)
    values = json.loads((draft / "tokenizer_config.json").read_text())
    values["bos_token"] = "</s>"
    (draft / "tokenizer_config.json").write_text(json.dumps(values))
    out = tmp_path / "out"
    assert run([command[0], "builtin:tiny-llama", *command[1:], "--out", str(out), "--target", "llmapi",
                "--speculative", "draft-target", "--draft-model", str(draft)]) != 0
    assert f"Error: --draft-model {draft} has bos_token id 2 where the target has 1" in capsys.readouterr().err
    assert not out.exists()
