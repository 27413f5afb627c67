"""Where each speculative decoding runs and how upstream spells it: the target refusals, MTP's check against the
model's config, ``trtllm-build``'s flags, the ``tensorrt_llm`` model's lookahead parameters and the LLM API's
``speculative_config`` by TensorRT-LLM version (docs/speculative.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtllm_kit.enums import Target
from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec.draft_tree import choices_text
from trtllm_kit.spec.speculative import NEEDS_DRAFT_DIR, Speculation, SpeculativeOptions

# the targets that can build each mode: lookahead's config says backend != pytorch; NGram, EAGLE3 and MTP are the
# PyTorch backend's; the cpu target's Python model runs prompt lookup and draft-target (the BLS's too); Medusa is the
# engine path's (speculative_config: "Medusa (engine only)"), as EAGLE-1 is (trtllm-build's "eagle"; EAGLE-3 is not
# among its --speculative_decoding_mode choices)
TARGETS: dict[Speculation, tuple[Target, ...]] = {
    Speculation.NGRAM: (Target.LLMAPI, Target.CPU),
    Speculation.DRAFT_TARGET: (Target.ENGINE, Target.LLMAPI, Target.CPU),
    Speculation.EAGLE3: (Target.LLMAPI,),
    Speculation.MTP: (Target.LLMAPI,),
    Speculation.LOOKAHEAD: (Target.ENGINE,),
    Speculation.MEDUSA: (Target.ENGINE,),
    Speculation.EAGLE: (Target.ENGINE,),
}
# trtllm-build --speculative_decoding_mode, for the modes the engine path builds
ENGINE_MODES: dict[Speculation, str] = {Speculation.DRAFT_TARGET: "draft_tokens_external",
                                        Speculation.LOOKAHEAD: "lookahead_decoding", Speculation.MEDUSA: "medusa",
                                        Speculation.EAGLE: "eagle"}
# the tensorrt_llm model's decoding_mode and the parameter naming its tree, for the modes with heads
TREE_PARAMETERS = {Speculation.MEDUSA: ("medusa", "medusa_choices"), Speculation.EAGLE: ("eagle", "eagle_choices")}
# speculative_config's decoding_type, 1.2.x then 1.3
DECODING_TYPES: dict[Speculation, tuple[str, str]] = {
    Speculation.NGRAM: ("NGram", "NGram"), Speculation.DRAFT_TARGET: ("DraftTarget", "DraftTarget"),
    Speculation.EAGLE3: ("Eagle", "Eagle3"), Speculation.MTP: ("MTP", "MTP"),
}
MODEL_DIR_KEY = {(1, 2): "speculative_model_dir", (1, 3): "speculative_model"}  # renamed in 1.3 (old name: alias)
MTP_LAYERS_KEY = "num_nextn_predict_layers"  # the HF config key of models with MTP layers (DeepSeek-V3, GLM-4.5)
NO_OVERLAP = (Speculation.NGRAM, Speculation.DRAFT_TARGET)  # upstream's examples turn the overlap scheduler off
CPU_MODE_KEY, CPU_DRAFT_LEN_KEY = "speculative_decoding_mode", "max_draft_len"  # the cpu tensorrt_llm model's
CPU_DRAFT_PATH_KEY = "draft_model_path"  # and, for draft-target, the draft checkpoint it runs in its engine
CPU_MODES = (Speculation.NGRAM, Speculation.DRAFT_TARGET)  # what the CPU tensorrt_llm model runs itself
# the draft each rank holds when served: the cpu target's draft-target build loads it twice, in tensorrt_llm_draft
# (the BLS's rounds) and in tensorrt_llm's own draft engine (the OpenAI routes), each with its KV pool
DRAFT_COPIES = {Target.CPU: 2}


def check_build(options: SpeculativeOptions, target: Target) -> None:
    """Refuse a mode without the draft directory it needs, or one ``target`` cannot build.

    Arguments:
        options: the ``[speculative]`` table; target: the resolved target (not ``auto``).
    """
    if options.mode is None:
        return
    needed = NEEDS_DRAFT_DIR.get(options.mode)
    if needed:
        if options.draft_model is None:
            raise KitUsageError(f"--speculative {options.mode} needs --draft-model DIR ({needed}); none was given.")
        if not options.draft_model.is_dir():
            raise KitUsageError(f"--draft-model {options.draft_model} is not a directory; pass {needed}.")
    if target in TARGETS[options.mode]:
        return
    able = " or ".join(str(t) for t in TARGETS[options.mode])
    raise KitUsageError(f"--speculative {options.mode} is not available on the {target} target; build with "
                        f"--target {able}.")


def mtp_layers(options: SpeculativeOptions, hf_config: Mapping[str, Any]) -> int:
    """The model's MTP layers (0 without ``--speculative mtp``); refused for a model that has none.

    Arguments:
        options: the ``[speculative]`` table; hf_config: the model's ``config.json``.
    """
    if options.mode is not Speculation.MTP:
        return 0
    layers = hf_config.get(MTP_LAYERS_KEY) or 0
    if not isinstance(layers, int) or layers < 1:
        raise KitUsageError(f"--speculative mtp needs a model whose config.json carries MTP layers "
                            f"({MTP_LAYERS_KEY} >= 1), got {layers!r}; use --speculative ngram or draft-target.")
    if options.max_draft_len is not None and options.max_draft_len != layers:
        raise KitUsageError(f"--max-draft-len {options.max_draft_len} differs from the model's {layers} MTP layers "
                            f"({MTP_LAYERS_KEY}); drop it.")
    return layers


def engine_flags(options: SpeculativeOptions) -> dict[str, str]:
    """``trtllm-build``'s ``--speculative_decoding_mode`` and ``--max_draft_len`` for the target engine (none
    without speculation).

    Arguments:
        options: the ``[speculative]`` table, already checked against the engine target.
    """
    if options.mode is None:
        return {}
    return {"speculative_decoding_mode": ENGINE_MODES[options.mode], "max_draft_len": str(options.draft_len)}


def lookahead_parameters(options: SpeculativeOptions) -> dict[str, str]:
    """The ``tensorrt_llm`` model's parameters for lookahead decoding (none for other modes).

    Arguments:
        options: the ``[speculative]`` table.
    """
    if options.mode is not Speculation.LOOKAHEAD:
        return {}
    return {"decoding_mode": "lookahead", "lookahead_window_size": str(options.lookahead_window_size),
            "lookahead_ngram_size": str(options.lookahead_ngram_size),
            "lookahead_verification_set_size": str(options.lookahead_verification_set_size)}


def decoding_parameters(options: SpeculativeOptions) -> dict[str, str]:
    """The engine's ``tensorrt_llm`` model parameters for its speculative decoding: lookahead's sizes, or Medusa's
    and EAGLE's ``decoding_mode`` and tree (``medusa_choices``, ``eagle_choices``: the backend's default tree has 63
    nodes, more than a kit engine's ``--max_draft_len``, so the tree is always given); none for other modes.

    Arguments:
        options: the ``[speculative]`` table.
    """
    if options.mode in TREE_PARAMETERS:
        mode, tree = TREE_PARAMETERS[options.mode]
        return {"decoding_mode": mode, tree: choices_text(options.tree)}
    return lookahead_parameters(options)


def cpu_parameters(options: SpeculativeOptions, draft_dir: Path | None = None) -> dict[str, str]:
    """The CPU ``tensorrt_llm`` model's parameters for prompt lookup, or for draft-target with the draft checkpoint
    the model runs in its own engine, so that requests sent straight to it (the OpenAI routes) speculate (none
    for other modes).

    Arguments:
        options: the ``[speculative]`` table; draft_dir: the draft checkpoint as the server sees it (draft-target).
    """
    if options.mode not in CPU_MODES:
        return {}
    values = {CPU_MODE_KEY: str(options.mode), CPU_DRAFT_LEN_KEY: str(options.draft_len)}
    if options.mode is Speculation.DRAFT_TARGET:
        assert draft_dir is not None, "a draft-target build converts its draft before the repo stage"
        values[CPU_DRAFT_PATH_KEY] = str(draft_dir)
    return values


def speculative_config(options: SpeculativeOptions, draft_dir: Path | None, mtp: int = 0,
                       version: tuple[int, int] = (1, 2)) -> dict[str, Any] | None:
    """The LLM API's ``speculative_config`` (None without speculation), in ``version``'s spelling.

    Arguments:
        options: the ``[speculative]`` table; draft_dir: where the served draft or EAGLE3 heads are;
        mtp: the model's MTP layers (``mtp_layers``); version: TensorRT-LLM's (major, minor), 1.2 or later.
    """
    if options.mode is None:
        return None
    if options.mode not in DECODING_TYPES:
        raise KitUsageError(f"--speculative {options.mode} has no LLM API form; build with --target engine.")
    newer = version >= (1, 3)
    config: dict[str, Any] = {"decoding_type": DECODING_TYPES[options.mode][newer]}
    if options.mode is Speculation.MTP:
        config["num_nextn_predict_layers"] = mtp
        return config
    config["max_draft_len"] = options.draft_len
    if options.mode in (Speculation.DRAFT_TARGET, Speculation.EAGLE3):
        if draft_dir is None:
            raise KitUsageError(f"--speculative {options.mode} needs --draft-model DIR; none was given.")
        config[MODEL_DIR_KEY[(1, 3) if newer else (1, 2)]] = str(draft_dir)
    if options.mode is Speculation.EAGLE3:
        config["eagle3_one_model"] = True
    return config


def verify_tokens(max_batch_size: int, draft_len: int) -> int:
    """Tokens one generation step verifies: each sequence's last token and its drafts, ``(K + 1)`` per sequence.

    Arguments:
        max_batch_size: sequences in generation; draft_len: K.
    """
    return max_batch_size * (draft_len + 1)
