"""The field table is whole and agrees with the runtime: every scalar row has a type, a rule its default obeys and
one tensor per dialect; the defaults are the CPU runtime's; the rules refuse exactly what it refuses."""

from __future__ import annotations

import math

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.tensors import NEVER_END_ID
from trtllm_kit.runtime import sampling_rules
from trtllm_kit.runtime.sequence import DEFAULT_PRIORITY, SamplingParams
from trtllm_kit.wire import request
from trtllm_kit.wire.fields import DIALECTS, rows
from trtllm_kit.wire.request import GenerationRequest
from trtllm_kit.wire.tensor import NUMPY

ROWS = rows(GenerationRequest)
SHARED = {"num_top_log_probs"}  # logprobs and prompt_logprobs share it (the larger count)
# wire field → the runtime SamplingParams field it becomes
RUNTIME = {"max_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
           "min_p": "min_p", "seed": "seed", "min_tokens": "min_tokens", "priority": "priority",
           "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty", "n": "n", "keep_end_token": "keep_end_token",
           "return_context_logits": "return_context_logits", "return_generation_logits": "return_generation_logits"}


def test_every_field_of_the_record_is_declared() -> None:
    assert {r.name for r in ROWS} == set(GenerationRequest.__dataclass_fields__)


def test_a_scalar_row_has_a_type_a_rule_and_a_default_it_accepts() -> None:
    for row in (r for r in ROWS if r.is_scalar):
        assert row.wire.dtype in NUMPY and row.rule is not None, row.name
        assert any(row.tensors(d) for d in DIALECTS), row.name
        if row.wire.default is not None:
            assert row.rule.checked(row.name, row.wire.default) == row.wire.default, row.name


def test_a_tensor_carries_one_field() -> None:
    for dialect in DIALECTS:
        names = [n for r in ROWS for n in r.tensors(dialect)]
        assert {n for n in names if names.count(n) > 1} <= SHARED, dialect


def test_the_defaults_are_the_runtimes() -> None:
    runtime = SamplingParams()
    for name, runtime_name in RUNTIME.items():
        if name != "max_tokens":
            assert GenerationRequest((1,)).setting(name) == getattr(runtime, runtime_name), name
    assert GenerationRequest((1,)).setting("max_tokens") == runtime.max_tokens == 16
    assert (request.NEVER_END_ID, request.DEFAULT_PRIORITY, request.MAX_LOGPROBS) == (
        NEVER_END_ID, DEFAULT_PRIORITY, sampling_rules.MAX_LOGPROBS)


# (field, value): each out of the runtime's range, or in it at an edge
PROBES = [("temperature", -0.5), ("temperature", 0.0), ("temperature", math.nan), ("top_k", -1), ("top_k", 0),
          ("top_p", 1.5), ("top_p", 1.0), ("top_p", 0.0), ("top_p", -0.1), ("min_p", 1.01), ("min_p", 1.0),
          ("min_p", -0.01), ("seed", -1), ("seed", 2**64 - 1), ("seed", 2**64), ("priority", 1.5), ("priority", 0.0),
          ("repetition_penalty", 0.0), ("repetition_penalty", 0.01), ("presence_penalty", 2.5),
          ("presence_penalty", -2.0), ("frequency_penalty", -2.01), ("frequency_penalty", 2.0), ("n", 0), ("n", 3),
          ("min_tokens", -1), ("min_tokens", 5), ("min_tokens", 6), ("max_tokens", 0), ("max_tokens", 1),
          ("logprobs", 21), ("logprobs", 20), ("logprobs", -1), ("prompt_logprobs", 21), ("prompt_logprobs", 0)]


def _refused(make) -> bool:
    try:
        make()
    except KitUsageError:
        return True
    return False


@pytest.mark.parametrize(("name", "value"), PROBES)
def test_the_rules_refuse_what_the_runtime_refuses(name: str, value: float) -> None:
    """Sent as a request of 5 tokens, a value the wire refuses is one the CPU runtime refuses, and the reverse."""
    wire_refuses = _refused(lambda: GenerationRequest((1,), **{"max_tokens": 5, name: value}))
    runtime_refuses = _refused(lambda: SamplingParams(**{"max_tokens": 5, RUNTIME.get(name, name): value}))
    assert wire_refuses == runtime_refuses


def test_best_of_below_n_is_refused_as_the_runtime_refuses_it() -> None:
    assert _refused(lambda: GenerationRequest((1,), n=3, best_of=2))
    assert _refused(lambda: SamplingParams(n=3, best_of=2))
    assert not _refused(lambda: GenerationRequest((1,), n=2, best_of=3))
