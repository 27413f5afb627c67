"""The ``[speculative]`` table: which speculative decoding a build sets up, its draft and its draft length; the
refusals that need the table alone (``spec.speculative_support`` holds those of a build: the draft directory a mode
needs, the target, the model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtllm_kit.enums import Choice
from trtllm_kit.errors import KitUsageError
from trtllm_kit.option import check_declared, option
from trtllm_kit.spec.draft_tree import parse_choices, top1_chain

DEFAULT_MAX_DRAFT_LEN = 4  # draft tokens per step when --max-draft-len is not given (EAGLE3: 3, as NVIDIA's example)
DEFAULT_EAGLE3_DRAFT_LEN = 3
LOOKAHEAD_DEFAULTS = (4, 3, 4)  # window, n-gram and verification-set sizes: TensorRT-LLM's lookahead defaults


class Speculation(Choice):
    """How draft tokens are proposed: a draft model, prompt lookup (n-grams of the prompt and the output),
    EAGLE3 heads, the model's own MTP layers, lookahead (Jacobi) decoding, or Medusa or EAGLE-1 heads built into the
    target's engine."""

    NGRAM = "ngram"
    DRAFT_TARGET = "draft-target"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    LOOKAHEAD = "lookahead"
    MEDUSA = "medusa"
    EAGLE = "eagle"


TREE_MODES = (Speculation.MEDUSA, Speculation.EAGLE)  # the engine verifies a tree of draft tokens
NEEDS_DRAFT_DIR = {Speculation.DRAFT_TARGET: "a draft model directory", Speculation.EAGLE3: "an EAGLE3 heads "
                   "checkpoint directory", Speculation.MEDUSA: "a Medusa heads checkpoint directory",
                   Speculation.EAGLE: "an EAGLE-1 heads checkpoint directory"}


@dataclass(frozen=True)
class SpeculativeOptions:
    """The ``[speculative]`` table (``mode`` None: no speculation)."""

    mode: Speculation | None = field(default=None, metadata=option(
        "Speculative decoding: ngram (prompt lookup, llmapi), draft-target (a --draft-model sharing the tokenizer; "
        "engine, llmapi), eagle3 (--draft-model is the heads checkpoint; llmapi), mtp (models with MTP layers; "
        "llmapi), lookahead (engine), medusa and eagle (--draft-model is the Medusa or EAGLE-1 heads checkpoint; "
        "engine).",
        "--speculative"))
    draft_model: Path | None = field(default=None, metadata=option(
        "With --speculative draft-target: the draft model directory; with eagle3, eagle or medusa: the heads "
        "checkpoint.",
        "--draft-model"))
    max_draft_len: int | None = field(default=None, metadata=option(
        f"Draft tokens proposed per step (default {DEFAULT_MAX_DRAFT_LEN}, eagle3 {DEFAULT_EAGLE3_DRAFT_LEN}, mtp "
        "the model's MTP layers; lookahead: from its sizes; medusa and eagle: the length of their top-1 path, or "
        "--draft-choices' paths).", "--max-draft-len", minimum=1))
    draft_choices: str | None = field(default=None, metadata=option(
        "Medusa and eagle: the tree of draft tokens as upstream's examples write it, paths of top-k indices (e.g. "
        "'[[0], [0, 0], [1]]'); K is its paths. Default: the top-1 path of K tokens.", "--draft-choices"))
    draft_logits: bool = field(default=False, metadata=option(
        "Draft-target on the engine target: build the draft with --gather_generation_logits, so a request may set "
        "use_draft_logits (the target accepts drafts on the draft's logits, not only its tokens)."))
    lookahead_window_size: int = field(default=LOOKAHEAD_DEFAULTS[0], metadata=option(
        "Lookahead: n-grams in the lookahead branch per step (W).", minimum=1))
    lookahead_ngram_size: int = field(default=LOOKAHEAD_DEFAULTS[1], metadata=option(
        "Lookahead: tokens per n-gram (N).", minimum=2))
    lookahead_verification_set_size: int = field(default=LOOKAHEAD_DEFAULTS[2], metadata=option(
        "Lookahead: n-grams in the verification branch per step (G).", minimum=1))

    def __post_init__(self) -> None:
        check_declared(self, "speculative")
        if self.mode is None:
            given = [name for name, value in (("--draft-model", self.draft_model), ("--max-draft-len",
                     self.max_draft_len), ("[speculative] draft_logits", self.draft_logits or None),
                     ("--draft-choices", self.draft_choices)) if value is not None]
            if given:
                raise KitUsageError(f"{given[0]} is given without --speculative; add --speculative draft-target (or "
                                    "another mode) or drop it.")
            return
        if self.mode not in NEEDS_DRAFT_DIR and self.draft_model is not None:
            raise KitUsageError(f"--speculative {self.mode} takes no --draft-model, got {self.draft_model}; drop it "
                                "or use --speculative draft-target.")
        if self.draft_logits and self.mode is not Speculation.DRAFT_TARGET:
            raise KitUsageError(f"[speculative] draft_logits applies to draft-target only, got mode {self.mode}; "
                                "drop it.")
        if self.draft_choices is not None:
            self._check_choices(self.draft_choices)
        if self.mode is Speculation.LOOKAHEAD and self.max_draft_len is not None:
            raise KitUsageError(f"--max-draft-len {self.max_draft_len} does not apply to lookahead, whose draft "
                                "length follows from [speculative] lookahead_window_size, lookahead_ngram_size and "
                                "lookahead_verification_set_size; drop it.")

    def _check_choices(self, text: str) -> None:
        if self.mode not in TREE_MODES:
            raise KitUsageError(f"--draft-choices applies to --speculative medusa or eagle, got {self.mode}; drop it.")
        paths = parse_choices(text)
        if self.max_draft_len is not None and self.max_draft_len != len(paths):
            raise KitUsageError(f"--max-draft-len {self.max_draft_len} differs from the {len(paths)} paths of "
                                "--draft-choices, which set the draft length; drop --max-draft-len.")

    @property
    def tree(self) -> tuple[tuple[int, ...], ...]:
        """The paths of the draft tree a Medusa or EAGLE engine verifies: ``--draft-choices`` or the top-1 path."""
        return parse_choices(self.draft_choices) if self.draft_choices is not None else top1_chain(self.draft_len)

    @property
    def draft_len(self) -> int:
        """Draft tokens per sequence and step (0 without speculation); MTP's default is resolved against the model
        (``speculative_support.mtp_draft_len``)."""
        if self.mode is None:
            return 0
        if self.mode is Speculation.LOOKAHEAD:
            return lookahead_draft_len(self.lookahead_window_size, self.lookahead_ngram_size,
                                       self.lookahead_verification_set_size)
        if self.draft_choices is not None:
            return len(parse_choices(self.draft_choices))
        if self.max_draft_len is not None:
            return self.max_draft_len
        return DEFAULT_EAGLE3_DRAFT_LEN if self.mode is Speculation.EAGLE3 else DEFAULT_MAX_DRAFT_LEN


def lookahead_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """Lookahead's draft tokens per step, as TensorRT-LLM's ``calculate_speculative_resource_tuple``.

    Arguments:
        window: W; ngram: N (>= 2); verification_set: G.
    """
    return (ngram - 2) + (window - 1 + verification_set) * (ngram - 1)
