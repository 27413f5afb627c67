"""Where each speculative decoding builds, MTP against the model's config, and upstream's spellings: the
``trtllm-build`` flags (1.2.x ``--speculative_decoding_mode`` choices), lookahead's ``tensorrt_llm`` parameters and
the LLM API's ``speculative_config`` in 1.2.x and 1.3 names."""

from __future__ import annotations

from pathlib import Path

import pytest
from speculative_engine_build import UPSTREAM_DECODING_MODES, UPSTREAM_MODES

from trtllm_kit.enums import Target
from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec.build_flags import FLAGS_1_2
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions
from trtllm_kit.spec.speculative_support import (
    check_build,
    engine_flags,
    lookahead_parameters,
    mtp_layers,
    speculative_config,
    verify_tokens,
)


def options(mode: str, **values: object) -> SpeculativeOptions:
    draft = Path(__file__).parent if mode in ("draft-target", "eagle3") else None  # any directory
    return SpeculativeOptions(mode=Speculation(mode), draft_model=draft, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "target", "message"), [
    ("ngram", Target.ENGINE, "--speculative ngram is not available on the engine target; build with --target "
                             "llmapi or cpu."),
    ("lookahead", Target.LLMAPI, "--speculative lookahead is not available on the llmapi target; build with "
                                 "--target engine."),
    ("eagle3", Target.ENGINE, "--speculative eagle3 is not available on the engine target; build with --target "
                              "llmapi."),
    ("mtp", Target.ENGINE, "--speculative mtp is not available on the engine target; build with --target llmapi."),
])
def test_a_target_that_cannot_build_a_mode_is_refused(mode: str, target: Target, message: str) -> None:
    with pytest.raises(KitUsageError) as error:
        check_build(options(mode), target)
    assert str(error.value) == message


@pytest.mark.parametrize(("mode", "target"), [("draft-target", Target.ENGINE), ("draft-target", Target.LLMAPI),
                                              ("lookahead", Target.ENGINE), ("ngram", Target.LLMAPI),
                                              ("ngram", Target.CPU), ("draft-target", Target.CPU),
                                              ("eagle3", Target.LLMAPI), ("mtp", Target.LLMAPI)])
def test_a_target_that_can_build_a_mode_passes(mode: str, target: Target) -> None:
    check_build(options(mode), target)


@pytest.mark.parametrize(("mode", "message"), [
    ("draft-target", "--speculative draft-target needs --draft-model DIR (a draft model directory); none was given."),
    ("eagle3", "--speculative eagle3 needs --draft-model DIR (an EAGLE3 heads checkpoint directory); none was "
               "given."),
])
def test_a_mode_without_its_draft_directory_is_refused(mode: str, message: str) -> None:
    with pytest.raises(KitUsageError) as error:
        check_build(SpeculativeOptions(mode=Speculation(mode)), Target.LLMAPI)
    assert str(error.value) == message


def test_a_draft_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    heads = tmp_path / "missing-heads"
    with pytest.raises(KitUsageError) as error:
        check_build(SpeculativeOptions(mode=Speculation.EAGLE3, draft_model=heads), Target.LLMAPI)
    assert str(error.value) == f"--draft-model {heads} is not a directory; pass an EAGLE3 heads checkpoint directory."


def test_mtp_needs_mtp_layers_in_the_model_config() -> None:
    assert mtp_layers(options("mtp"), {"num_nextn_predict_layers": 1}) == 1
    with pytest.raises(KitUsageError, match=r"carries MTP layers \(num_nextn_predict_layers >= 1\), got 0"):
        mtp_layers(options("mtp"), {"model_type": "llama"})
    with pytest.raises(KitUsageError, match="--max-draft-len 3 differs from the model's 1 MTP layers"):
        mtp_layers(options("mtp", max_draft_len=3), {"num_nextn_predict_layers": 1})
    assert mtp_layers(options("ngram"), {}) == 0


@pytest.mark.parametrize(("mode", "flags"), [
    ("draft-target", {"speculative_decoding_mode": "draft_tokens_external", "max_draft_len": "4"}),
    ("lookahead", {"speculative_decoding_mode": "lookahead_decoding", "max_draft_len": "15"}),
])
def test_engine_flags_are_trtllm_build_flags(mode: str, flags: dict[str, str]) -> None:
    made = engine_flags(options(mode))
    assert made == flags
    assert made["speculative_decoding_mode"] in UPSTREAM_MODES
    assert "max_draft_len" in FLAGS_1_2
    assert engine_flags(SpeculativeOptions()) == {}


def test_lookahead_parameters_name_upstream_decoding_mode() -> None:
    made = lookahead_parameters(options("lookahead", lookahead_window_size=7, lookahead_ngram_size=5,
                                        lookahead_verification_set_size=6))
    assert made == {"decoding_mode": "lookahead", "lookahead_window_size": "7", "lookahead_ngram_size": "5",
                    "lookahead_verification_set_size": "6"}
    assert made["decoding_mode"] in UPSTREAM_DECODING_MODES
    assert lookahead_parameters(options("draft-target")) == {}


@pytest.mark.parametrize(("mode", "version", "config"), [
    ("ngram", (1, 2), {"decoding_type": "NGram", "max_draft_len": 4}),
    ("draft-target", (1, 2), {"decoding_type": "DraftTarget", "max_draft_len": 4,
                              "speculative_model_dir": "/out/draft"}),
    ("draft-target", (1, 3), {"decoding_type": "DraftTarget", "max_draft_len": 4, "speculative_model": "/out/draft"}),
    ("eagle3", (1, 2), {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "/out/draft",
                        "eagle3_one_model": True}),
    ("eagle3", (1, 3), {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/out/draft",
                        "eagle3_one_model": True}),
    ("mtp", (1, 2), {"decoding_type": "MTP", "num_nextn_predict_layers": 2}),
])
def test_speculative_config_by_version(mode: str, version: tuple[int, int], config: dict[str, object]) -> None:
    assert speculative_config(options(mode), Path("/out/draft"), mtp=2, version=version) == config


def test_speculative_config_refuses_lookahead_and_is_none_without_speculation() -> None:
    assert speculative_config(SpeculativeOptions(), None) is None
    with pytest.raises(KitUsageError, match="--speculative lookahead has no LLM API form"):
        speculative_config(options("lookahead"), None)


def test_the_verify_step_takes_k_plus_one_tokens_per_sequence() -> None:
    assert verify_tokens(8, 4) == 40
    assert verify_tokens(8, 0) == 8
