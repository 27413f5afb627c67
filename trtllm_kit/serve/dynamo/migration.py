"""A migrated request continued as the unfaulted one would be, or refused in one sentence.

When a worker dies mid-stream, Dynamo's frontend sends the request again, under the same request id, to another
worker, with the tokens already generated appended to the prompt and ``max_tokens`` reduced by them. Nothing in the
request says which tokens were generated, so the workers of one serve keep a ledger in the run directory: the first
worker to see a request records its prompt length under the request id, and removes it when the request ends. A
worker that finds the id already recorded is continuing a migrated request, ``len(token_ids)`` minus the recorded
length tokens in.

What continues exactly on the longer prompt: greedy and unseeded sampling with its truncations (top-k, top-p, the
probability floor), the repetition penalty (the CPU runtime counts prompt and output tokens alike), stop strings
(the frontend's), the minimum length (reduced by the tokens generated) and logprobs (the tokens already sent keep
theirs; the new worker scores the rest, the same alternatives with values within float32 rounding, as it computes
the generated tokens' keys and values in one prefill rather than step by step; the prompt's logprobs came with
the first chunk, and are not computed again). What does not, and is refused: seeded sampling (the new worker's
random stream starts again), the penalties that count output tokens only, and guided decoding (the grammar would
start again at the generated text; Dynamo's frontend does not migrate those either). Each field's rule is its
row's ``migration`` (``trtllm_kit.wire.request``); the rest continue unchanged."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from trtllm_kit.llmapi.cpu_llm import SamplingParams
from trtllm_kit.serve.dynamo.request import PARAMS, DynamoRequestError
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.request import is_greedy

REQUEST_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # Dynamo's ids are UUIDs; anything else is not recorded


class MigrationRefused(DynamoRequestError):
    """A migrated request whose continuation would differ from the unfaulted answer."""


class Ledger:
    """The prompt lengths of the requests in flight on any worker of the serve, one file per request id.

    Arguments:
        root: the directory every worker of the serve shares (``RUN_DIR/dynamo/requests``).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def begin(self, request_id: str, num_prompt_tokens: int) -> int:
        """The request's original prompt length: the recorded one if a worker saw it before, else this one, recorded.

        Arguments:
            request_id: Dynamo's request id (kept across a migration); num_prompt_tokens: the prompt's length now.
        """
        if not REQUEST_ID.fullmatch(request_id):
            return num_prompt_tokens
        path = self.root / request_id
        try:
            return int(path.read_text())
        except FileNotFoundError:
            path.write_text(str(num_prompt_tokens))
            return num_prompt_tokens

    def end(self, request_id: str) -> None:
        """Forget the request (it finished, failed or was cancelled on this worker).

        Arguments:
            request_id: Dynamo's request id.
        """
        if REQUEST_ID.fullmatch(request_id):
            (self.root / request_id).unlink(missing_ok=True)


def continuation(sampling: SamplingParams, num_generated: int) -> SamplingParams:
    """The settings that continue a request ``num_generated`` tokens in as the unfaulted run would (each field by
    its row's ``migration``); refuses, in one sentence, settings that cannot.

    Arguments:
        sampling: the request's settings; num_generated: the tokens its dead worker generated (now in the prompt).
    """
    moved = [(row, PARAMS[row.name], row.wire.migration) for row in rows(GenerationRequest)
             if row.wire.migration is not None]
    unset = {f.name: f.default for f in fields(SamplingParams)}
    for row, name, rule in moved:
        value = getattr(sampling, name)
        if rule.rule == "refused" and value != unset[name] and not (rule.sampled and is_greedy(sampling)):
            said = value if row.is_scalar else "set"
            raise MigrationRefused(f"the request lost its worker {num_generated} tokens in and is not migrated: "
                                   f"sampling_options.{name} is {said}, {rule.why}.")
    changes: dict[str, Any] = {}
    for _row, name, rule in moved:
        value = getattr(sampling, name)
        if rule.rule == "dropped" and value is not None:
            changes[name] = None
        elif rule.rule == "reduced" and value:
            changes[name] = max(0, value - num_generated)
    return replace(sampling, **changes) if changes else sampling
