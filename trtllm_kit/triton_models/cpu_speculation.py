"""The CPU ``tensorrt_llm`` model's speculation: it always verifies a request's own drafts first (``draft_input_ids``,
as the BLS's draft-target rounds send them); a request without drafts takes drafts of ``max_draft_len`` tokens
from the mode its parameters name: ``speculative_decoding_mode: ngram`` (prompt lookup) or ``draft-target`` (the
checkpoint at ``draft_model_path`` run in the model's own draft engine, ``runtime/draft_model.py``), so that
requests sent straight to ``tensorrt_llm`` (the OpenAI routes) speculate as the BLS's do."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.draft_model import DraftModel, draft_config
from trtllm_kit.runtime.external_drafts import ExternalDrafts
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.prompt_lookup import PromptLookup
from trtllm_kit.runtime.speculation import AtMost, FirstDraft, Proposer, Speculator
from trtllm_kit.spec.speculative import Speculation
from trtllm_kit.spec.speculative_support import CPU_DRAFT_LEN_KEY, CPU_DRAFT_PATH_KEY, CPU_MODE_KEY, CPU_MODES


def cpu_speculator(values: Mapping[str, str], config: EngineConfig, repository: Path = Path("."),
                   vocab_size: int | None = None) -> Speculator:
    """The speculator the model's engine runs with.

    Arguments:
        values: the model's parameters; config: its engine settings (a request's drafts are bounded by
        ``max_num_tokens`` only); repository: the model's directory, where a relative ``draft_model_path``
        resolves; vocab_size: the target's vocabulary (a draft token beyond it ends the draft; None: the draft's).
    """
    mode = _set(values, CPU_MODE_KEY)
    if not mode:
        return Speculator(ExternalDrafts(), config.max_num_tokens)
    if mode not in CPU_MODES:
        runnable = " or ".join(str(m) for m in CPU_MODES)
        raise KitUsageError(f"parameter {CPU_MODE_KEY} is {mode!r}; the CPU runtime's model runs {runnable}, or "
                            "leave it empty.")
    raw = _set(values, CPU_DRAFT_LEN_KEY)
    if not raw.isdigit() or int(raw) < 1:
        raise KitUsageError(f"parameter {CPU_DRAFT_LEN_KEY} is {raw!r}; set a whole number of draft tokens, at "
                            "least 1.")
    draft_len = int(raw)
    own: Proposer = PromptLookup(max_draft_len=draft_len)
    if mode == Speculation.DRAFT_TARGET:
        own = AtMost(_draft_model(values, config, repository, draft_len, vocab_size), draft_len)
    return Speculator(FirstDraft(ExternalDrafts(), own), config.max_num_tokens)


def _set(values: Mapping[str, str], key: str) -> str:
    """A parameter's value ("" when absent or left as ``${...}``)."""
    value = str(values.get(key) or "").strip()
    return "" if value.startswith("${") else value


def _draft_model(values: Mapping[str, str], config: EngineConfig, repository: Path, draft_len: int,
                 vocab_size: int | None) -> DraftModel:
    """The draft checkpoint of ``draft_model_path``, loaded in its own engine; refused when it holds none."""
    raw = _set(values, CPU_DRAFT_PATH_KEY)
    path = repository / raw  # an absolute path stays absolute
    if not raw or not (path / "config.json").is_file():
        raise KitUsageError(f"parameter {CPU_DRAFT_PATH_KEY} is {raw!r}, which holds no draft checkpoint "
                            f"(config.json); point it at the draft's checkpoint, or rebuild with --speculative "
                            f"{Speculation.DRAFT_TARGET} --draft-model DIR.")
    model = CheckpointModel.load(path)
    return DraftModel(model, draft_config(config, draft_len),
                      model.dims.vocab_size if vocab_size is None else vocab_size)
