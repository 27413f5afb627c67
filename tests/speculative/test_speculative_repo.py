"""Lookahead on the engine target: the ``tensorrt_llm`` model's ``decoding_mode: lookahead`` and its window, n-gram
and verification-set sizes, under upstream's parameter names (``inflight_batcher_llm/tensorrt_llm/config.pbtxt``)."""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.model_repo.configs import BACKEND_DEFAULT_KEYS, parse_config
from trtllm_kit.model_repo.repository import write_repository
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions
from trtllm_kit.spec.speculative_support import lookahead_parameters
from trtllm_kit.targets import EngineLimits

LIMITS = EngineLimits(target="engine", model_dir=Path("/models/engines"), max_batch_size=64, max_num_tokens=8192,
                      max_seq_len=4096, max_beam_width=1, tokens_per_block=32, use_paged_context_fmha=True, tp_size=1,
                      pp_size=1)
UPSTREAM_SIZES = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")


def parameters(repo: Path) -> dict[str, str]:
    config = parse_config((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    return {key: value.string_value for key, value in config.parameters.items()}


def write(repo: Path, decoding: dict[str, str] | None) -> dict[str, str]:
    tokenizer = builtin_dir("tiny-llama")
    write_repository(repo, LIMITS, RepoOptions(), model_path=LIMITS.model_dir,
                     tokenizer_files=sorted(tokenizer.glob("tokenizer*.json")), decoding=decoding)
    return parameters(repo)


def test_lookahead_sets_decoding_mode_and_the_sizes(tmp_path: Path) -> None:
    options = SpeculativeOptions(mode=Speculation.LOOKAHEAD, lookahead_window_size=5, lookahead_ngram_size=4,
                                 lookahead_verification_set_size=3)
    made = write(tmp_path / "repo", lookahead_parameters(options))
    assert made["decoding_mode"] == "lookahead"
    assert {key: made[key] for key in UPSTREAM_SIZES} == {"lookahead_window_size": "5", "lookahead_ngram_size": "4",
                                                          "lookahead_verification_set_size": "3"}
    assert set(UPSTREAM_SIZES) <= set(BACKEND_DEFAULT_KEYS)  # the backend's own names for them


def test_without_speculation_the_sizes_stay_unset(tmp_path: Path) -> None:
    made = write(tmp_path / "repo", lookahead_parameters(SpeculativeOptions()))
    assert made["decoding_mode"] == "top_k_top_p"
    assert not set(UPSTREAM_SIZES) & set(made)
