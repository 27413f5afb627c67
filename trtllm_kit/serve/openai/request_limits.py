"""Bounds on the size of one OpenAI request, each refused with an error that names the bound
(docs/request-limits.md lists them): the body, the stop sequences, the prompt, and the logprob entries its
response can hold (the JSON nesting: ``serve/http/body.py``)."""

from __future__ import annotations

MAX_BODY_BYTES = 4 * 1024 * 1024  # a request body; larger is a 413
MAX_STOPS = 64  # stop sequences in one request
MAX_STOP_CHARS = 1000  # characters of one stop sequence
MAX_STOP_TOTAL_CHARS = 16384  # characters of all stop sequences together
MAX_PROMPTS = 64  # prompts in one completion request
MAX_N = 16  # choices per prompt (``n``)
MAX_LOGPROB_ENTRIES = 131072  # logprob entries of one response: scored tokens and their alternatives (~10 MB)


def stops_problem(stops: list[str]) -> str | None:
    """A sentence naming the bound ``stops`` exceed (count, one's length, total length), else None.

    Arguments:
        stops: the request's stop sequences.
    """
    if len(stops) > MAX_STOPS:
        return f"stop holds {len(stops)} sequences; at most {MAX_STOPS} are allowed."
    longest = max(stops, key=len, default="")
    if len(longest) > MAX_STOP_CHARS:
        return (f"a stop sequence has {len(longest)} characters; at most {MAX_STOP_CHARS} are allowed in each "
                f"({longest[:20]!r}...).")
    total = sum(map(len, stops))
    if total > MAX_STOP_TOTAL_CHARS:
        return f"the stop sequences have {total} characters together; at most {MAX_STOP_TOTAL_CHARS} are allowed."
    return None


def logprob_entries_problem(num_sequences: int, num_scored_tokens: int, num_top: int, top_name: str) -> str | None:
    """A sentence when a response could hold more than ``MAX_LOGPROB_ENTRIES`` logprob entries, else None: every
    sequence's scored tokens (``max_tokens``, and with ``echo`` its prompt's), each with ``num_top`` alternatives.

    Arguments:
        num_sequences: sequences per prompt (``best_of``, else ``n``: the frontend holds them all);
        num_scored_tokens: tokens scored for one sequence of each prompt, summed over the prompts; num_top:
        alternatives per token; top_name: the field that asks for them (``top_logprobs`` or ``logprobs``).
    """
    entries = num_sequences * num_scored_tokens * (num_top + 1)
    if entries <= MAX_LOGPROB_ENTRIES:
        return None
    return (f"the response could hold {entries} logprob entries ({num_sequences} sequences per prompt x "
            f"{num_scored_tokens} scored tokens x ({top_name} {num_top} + 1)), more than the {MAX_LOGPROB_ENTRIES} "
            f"allowed in one response; lower n (or best_of), max_tokens or {top_name}, or split the request.")
