"""A migrated request continued as the unfaulted one would be, or refused in one sentence.

When a worker dies mid-stream, Dynamo's frontend sends the request again, under the same request id, to another
worker, with the tokens already generated appended to the prompt and ``max_tokens`` reduced by them. Nothing in the
request says which tokens were generated, so the workers of one serve keep a ledger in the run directory: the first
worker to see a request records its prompt length under the request id, and removes it when the request ends. A
worker that finds the id already recorded is continuing a migrated request, ``len(token_ids)`` minus the recorded
length tokens in.

What continues exactly on the longer prompt: greedy and unseeded sampling with its truncations (top-k, top-p, the
probability floor), the repetition penalty (the CPU runtime counts prompt and output tokens alike), stop strings
(the frontend's), ``min_tokens`` (reduced by the tokens generated) and logprobs (the tokens already sent keep
theirs; the new worker scores the rest, the same alternatives with values within float32 rounding, as it computes
the generated tokens' keys and values in one prefill rather than step by step; the prompt's logprobs came with
the first chunk, and are not computed again). What does not, and is refused: seeded
sampling (the new worker's random stream starts again), presence and frequency penalties (they count output tokens
only) and guided decoding (the grammar would start again at the generated text; Dynamo's frontend does not migrate
those either). """

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from trtllm_kit.llmapi.cpu_llm import SamplingParams
from trtllm_kit.runtime.sampling_rules import MIN_TEMPERATURE
from trtllm_kit.serve.dynamo.request import DynamoRequestError

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
    """The settings that continue a request ``num_generated`` tokens in as the unfaulted run would; refuses, in one
    sentence, settings that cannot.

    Arguments:
        sampling: the request's settings; num_generated: the tokens its dead worker generated (now in the prompt).
    """
    lost = f"the request lost its worker {num_generated} tokens in and is not migrated: "
    is_greedy = sampling.top_k == 1 or (sampling.temperature is not None and sampling.temperature < MIN_TEMPERATURE)
    if sampling.seed is not None and not is_greedy:
        raise MigrationRefused(f"{lost}sampling_options.seed is {sampling.seed}, whose random stream another worker "
                               "cannot resume; send it again, or without a seed to let it migrate.")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(sampling, name):
            raise MigrationRefused(f"{lost}sampling_options.{name} is {getattr(sampling, name)}, which counts "
                                   "output tokens another worker sees as prompt; send it again.")
    if sampling.guided_decoding is not None:
        raise MigrationRefused(f"{lost}sampling_options.guided_decoding is set, whose grammar another worker would "
                               "start again; send it again.")
    if sampling.prompt_logprobs is not None:  # the first chunk, which the dead worker sent, carried them
        sampling = replace(sampling, prompt_logprobs=None)
    if sampling.min_tokens:
        return replace(sampling, min_tokens=max(0, sampling.min_tokens - num_generated))
    return sampling
