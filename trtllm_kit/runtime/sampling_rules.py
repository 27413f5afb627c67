"""The sampling values every target accepts, stated once: the frontend, the CPU runtime and the llmapi model's
CPU class check requests against them before a value reaches an engine.

A temperature below ``MIN_TEMPERATURE`` divides logits into infinities (softmax then gives NaN), so it is taken
as greedy, as vLLM does below the same 1e-5. ``top_p`` must lie in (0, 1]. A seed is a 64-bit unsigned
integer: 0 to ``MAX_SEED`` (2**64 - 1); larger is refused, not wrapped.

The extra fields carry vLLM's names, defaults and ranges (``EXTRA_DEFAULTS``, ``extras_problem``): ``top_k`` 0 =
off, ``min_p`` in [0, 1], ``repetition_penalty`` > 0 (1 = off), ``presence_penalty`` and ``frequency_penalty`` in
[-2, 2], ``min_tokens`` >= 0, ``n`` >= 1, ``best_of`` >= ``n``, ``logprobs`` and ``prompt_logprobs`` 0 to
``MAX_LOGPROBS`` alternatives.
"""

from __future__ import annotations

from trtllm_kit.wire.request import MAX_LOGPROBS
from trtllm_kit.wire.rules import INT_RANGES

MIN_TEMPERATURE = 1e-5
MAX_SEED = INT_RANGES["UINT64"][1]
EXTRA_DEFAULTS = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                  "frequency_penalty": 0.0, "min_tokens": 0, "ignore_eos": False, "n": 1}


def is_greedy_temperature(temperature: float) -> bool:
    """Whether ``temperature`` means greedy decoding (0, or too small to divide logits by).

    Arguments:
        temperature: a non-negative temperature.
    """
    return temperature < MIN_TEMPERATURE


def sampling_problem(temperature: float | None, top_p: float | None,
                     seed: int | None) -> tuple[str, str] | None:
    """The field that is wrong and a sentence saying so, or None when an engine can run these values.

    Arguments:
        temperature, top_p, seed: the request's values (None: the default).
    """
    if temperature is not None and not 0 <= temperature <= 2:
        return "temperature", f"temperature must be between 0 and 2, got {temperature!r}."
    if top_p is not None and not 0 < top_p <= 1:
        return "top_p", f"top_p must be in (0, 1], got {top_p!r}."
    if seed is not None and not 0 <= seed <= MAX_SEED:
        return "seed", f"seed must be an integer from 0 to 2**64 - 1, got {seed}."
    return None


def extras_problem(top_k: int | None = None, min_p: float | None = None, repetition_penalty: float | None = None,
                   presence_penalty: float | None = None, frequency_penalty: float | None = None,
                   min_tokens: int | None = None, n: int | None = None, best_of: int | None = None,
                   logprobs: int | None = None, prompt_logprobs: int | None = None) -> tuple[str, str] | None:
    """The first extra field out of its range and a sentence saying so, or None when all are valid.

    Arguments:
        the request's values, vLLM's names (None: the default).
    """
    checks = (
        ("top_k", top_k, top_k is None or top_k >= 0, "an integer >= 0 (0 = off)"),
        ("min_p", min_p, min_p is None or 0 <= min_p <= 1, "in [0, 1]"),
        ("repetition_penalty", repetition_penalty, repetition_penalty is None or repetition_penalty > 0,
         "greater than 0 (1 = off)"),
        ("presence_penalty", presence_penalty, presence_penalty is None or -2 <= presence_penalty <= 2,
         "in [-2, 2]"),
        ("frequency_penalty", frequency_penalty, frequency_penalty is None or -2 <= frequency_penalty <= 2,
         "in [-2, 2]"),
        ("min_tokens", min_tokens, min_tokens is None or min_tokens >= 0, "an integer >= 0"),
        ("n", n, n is None or n >= 1, "an integer >= 1"),
        ("best_of", best_of, best_of is None or best_of >= max(n or 1, 1), f"an integer >= n ({n or 1})"),
        ("logprobs", logprobs, logprobs is None or 0 <= logprobs <= MAX_LOGPROBS, f"in [0, {MAX_LOGPROBS}]"),
        ("prompt_logprobs", prompt_logprobs, prompt_logprobs is None or 0 <= prompt_logprobs <= MAX_LOGPROBS,
         f"in [0, {MAX_LOGPROBS}]"),
    )
    for name, value, is_valid, allowed in checks:
        if not is_valid:  # a NaN fails every comparison, so it lands here too
            return name, f"{name} must be {allowed}, got {value!r}."
    return None
