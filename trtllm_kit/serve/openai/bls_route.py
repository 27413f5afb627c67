"""Where a served artifact's OpenAI requests go when it speculates: the route choice, and what the BLS route refuses.

The CPU ``tensorrt_llm`` model (cpu target) runs a draft-target build's draft itself, so the frontend tokenizes text
and sends it straight there (the direct route). The C++ ``tensorrt_llm`` model (engine target) drafts nothing
itself: draft-target speculation runs in ``tensorrt_llm_bls``, which calls ``tensorrt_llm_draft`` and the target in
rounds for a request that sends ``num_draft_tokens`` > 0, text in and text out (``triton_models/draft_rounds.py``).
On that route the frontend sends text with ``num_draft_tokens`` = the build's ``max_draft_len``
(``bls_client.py``), and refuses what the BLS's rounds cannot answer.
"""

from __future__ import annotations

from trtllm_kit.enums import Target
from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.sampling_fields import OpenAIRequest, Prompt
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions


def bls_num_draft_tokens(target: str, speculative: SpeculativeOptions) -> int | None:
    """The route choice of an artifact: the ``num_draft_tokens`` its OpenAI requests send to the BLS (draft-target
    on the engine target, whose ``tensorrt_llm`` drafts nothing itself), or None for the direct route (to
    ``tensorrt_llm``, which speculates itself when it does at all).

    Arguments:
        target: the artifact's target (``Artifact.target``); speculative: its ``[speculative]`` table.
    """
    if target == Target.ENGINE.value and speculative.mode is Speculation.DRAFT_TARGET:
        return speculative.draft_len
    return None


def refuse_unanswered(req: OpenAIRequest, prompts: list[Prompt]) -> None:
    """Refuse, in one sentence naming the field, what a request on the BLS route asks and the BLS's draft-target
    rounds cannot answer: a prompt as token ids, logprobs, ``best_of`` and structured output. ``n`` choices are
    ``n`` BLS requests (``serving.py``), and the BLS streams one response per round.

    Arguments:
        req: the parsed request; prompts: its prompts.
    """
    why = "this model speculates through tensorrt_llm_bls (draft-target on a TensorRT-LLM engine)"
    if any(isinstance(prompt, tuple) for prompt in prompts):
        raise HTTPError(f"prompt is token ids, and {why}, which takes text; send the prompt as text.",
                        param="prompt")
    if req.scoring.logprobs is not None:
        value = req.scoring.logprobs if req.kind == "text_completion" else "true"
        raise HTTPError(f"logprobs is {value}, and {why}, whose rounds return no log probabilities; leave logprobs "
                        "out.", param="logprobs")
    if req.best_of is not None:
        raise HTTPError(f"best_of is {req.best_of}, and {why}, whose rounds return no log probabilities to rank "
                        "sequences by; leave best_of out.", param="best_of")
    if req.guide is not None:
        field = req.guide_field or "response_format"
        raise HTTPError(f"{field} asks for structured output, and {why}, whose text interface takes no guide; "
                        f"leave {field} out.", param=field)
