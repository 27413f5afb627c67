"""Synthetic prompts: exact lengths, per-request seeds, no special ids, seeded distributions, .jsonl files."""

from __future__ import annotations

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.workload import WorkloadSpec, read_jsonl, sample_lengths, synthetic_prompts, write_jsonl


def test_fixed_grid_prompts_are_exact_distinct_and_reproducible():
    spec = WorkloadSpec(isl=64, osl=32, vocab_size=50, special_ids=(0, 1, 2), seed=7)
    prompts = synthetic_prompts(spec, 20)
    assert all(p.isl == 64 and p.osl == 32 for p in prompts)
    assert len({p.input_ids for p in prompts}) == 20
    assert all(3 <= t < 50 for p in prompts for t in p.input_ids)
    assert synthetic_prompts(spec, 20) == prompts
    # request n is seeded by seed + n: a later slice reproduces the same prompts
    assert synthetic_prompts(spec, 5, first=10)[0].input_ids == prompts[10].input_ids
    assert synthetic_prompts(WorkloadSpec(isl=64, osl=32, vocab_size=50, seed=8), 1)[0] != prompts[0]


def test_length_distributions_are_seeded_and_clipped():
    lengths = sample_lengths(100, 30, 2000, seed=1)
    assert lengths == sample_lengths(100, 30, 2000, seed=1) and min(lengths) >= 1
    assert abs(sum(lengths) / len(lengths) - 100) < 3
    assert sample_lengths(5, 0, 3, seed=1) == [5, 5, 5]
    prompts = synthetic_prompts(WorkloadSpec(isl=50, osl=20, isl_std=10, osl_std=5), 50)
    assert len({p.isl for p in prompts}) > 5 and len({p.osl for p in prompts}) > 3


def test_jsonl_round_trip_and_errors(tmp_path):
    prompts = synthetic_prompts(WorkloadSpec(isl=8, osl=4), 3)
    digest = write_jsonl(prompts, tmp_path / "p.jsonl")
    assert len(digest) == 64
    assert read_jsonl(tmp_path / "p.jsonl") == prompts
    (tmp_path / "bad.jsonl").write_text('{"task_id": 1, "input_ids": [1, 2]}\n')
    with pytest.raises(KitUsageError, match=r"bad.jsonl:1 is not a prompt line"):
        read_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(KitUsageError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_invalid_workload_is_a_usage_error():
    with pytest.raises(KitUsageError, match="at least 1"):
        WorkloadSpec(isl=0)


@pytest.mark.parametrize("isl", [1, 2, 16, 200])
def test_text_prompts_encode_to_the_requested_length(isl, tmp_path):
    from tokenizers import Tokenizer

    from trtllm_kit.models.tokenizer import write_tokenizer
    from trtllm_kit.profile.prompt_text import text_decoder

    write_tokenizer(tmp_path, 4096)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text_of = text_decoder(tmp_path)
    prompts = synthetic_prompts(WorkloadSpec(isl=isl, osl=1, vocab_size=1024), 40)
    assert [len(tokenizer.encode(text_of(p)).ids) for p in prompts] == [max(isl, 2)] * 40  # BOS and one token at least
