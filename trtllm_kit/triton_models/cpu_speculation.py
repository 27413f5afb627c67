"""The CPU ``tensorrt_llm`` model's speculation: it always verifies a request's own drafts (``draft_input_ids``, as
the BLS's draft-target rounds send them); with the parameter ``speculative_decoding_mode: ngram`` (a cpu build
with ``--speculative ngram``) a request without drafts takes prompt-lookup drafts of ``max_draft_len`` tokens."""

from __future__ import annotations

from collections.abc import Mapping

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.external_drafts import ExternalDrafts
from trtllm_kit.runtime.prompt_lookup import PromptLookup
from trtllm_kit.runtime.speculation import FirstDraft, Speculator
from trtllm_kit.spec.speculative import Speculation
from trtllm_kit.spec.speculative_support import CPU_DRAFT_LEN_KEY, CPU_MODE_KEY


def cpu_speculator(values: Mapping[str, str], config: EngineConfig) -> Speculator:
    """The speculator the model's engine runs with.

    Arguments:
        values: the model's parameters; config: its engine settings (a request's drafts are bounded by
        ``max_num_tokens`` only).
    """
    mode = str(values.get(CPU_MODE_KEY) or "").strip()
    if not mode or mode.startswith("${"):
        return Speculator(ExternalDrafts(), config.max_num_tokens)
    if mode != str(Speculation.NGRAM):
        raise KitUsageError(f"parameter {CPU_MODE_KEY} is {mode!r}; the CPU runtime's model runs "
                            f"{Speculation.NGRAM} (draft-target runs through tensorrt_llm_bls), or leave it empty.")
    raw = str(values.get(CPU_DRAFT_LEN_KEY) or "")
    if not raw.isdigit() or int(raw) < 1:
        raise KitUsageError(f"parameter {CPU_DRAFT_LEN_KEY} is {raw!r}; set a whole number of draft tokens, at "
                            "least 1.")
    return Speculator(FirstDraft(ExternalDrafts(), PromptLookup(max_draft_len=int(raw))), config.max_num_tokens)
