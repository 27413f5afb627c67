"""Accuracy on the shipped multiple-choice set (``trtllm_kit/data/choices.txt``): each question is asked as
``Question: ...\\nAnswer:`` and the option whose tokens the model finds likeliest (summed log-probabilities, as
lm-eval's ``acc``) is its pick. The set is small and easy (40 questions of everyday knowledge, written for the kit),
so it tells a trained model from a random one and shows which picks a quantization changes; with 2.5 points a
question, it is reported, not gated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

# (token ids [1, T], positions [1, T], boolean mask [T, T]: True where a token sees another) → logits [1, T, V]
TreeForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class Question:
    """One question and its options, the right one first."""

    text: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class ChoiceScores:
    """A model's picks (option indexes, 0 is right) over the set and its accuracy."""

    picks: tuple[int, ...]

    @property
    def accuracy(self) -> float:
        return sum(p == 0 for p in self.picks) / len(self.picks) if self.picks else float("nan")

    def agreement(self, other: ChoiceScores) -> float:
        """The share of questions both models pick the same option for."""
        return sum(a == b for a, b in zip(self.picks, other.picks, strict=True)) / len(self.picks)


def heldout_path() -> Path:
    """The held-out evaluation text (``trtllm_kit/data/heldout.txt``): perplexity is measured on it, never on the
    calibration corpus."""
    return Path(str(resources.files("trtllm_kit") / "data" / "heldout.txt"))


def choices_path() -> Path:
    """The shipped multiple-choice set."""
    return Path(str(resources.files("trtllm_kit") / "data" / "choices.txt"))


def load_questions(path: Path | None = None) -> list[Question]:
    """The questions of a set (default: the shipped one); ``#`` lines are comments.

    Arguments:
        path: a file of tab-separated lines: question, right answer, wrong answers.
    """
    questions = []
    for line in (path or choices_path()).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            text, *options = line.split("\t")
            questions.append(Question(text, tuple(options)))
    return questions


@dataclass(frozen=True)
class OptionTree:
    """A question's context and its options in one sequence: each option follows the context at the same positions
    and sees the context and itself, never another option, so one forward pass over the context and the options
    gives each option's log-probabilities as its own sequence would (the context's keys are computed once)."""

    ids: torch.Tensor  # [1, T]: the context, then each option's tokens
    positions: torch.Tensor  # [1, T]
    mask: torch.Tensor  # [T, T] boolean
    rows: list[torch.Tensor]  # per option: the rows whose logits predict its tokens (the context's last, then its own)
    targets: list[torch.Tensor]  # per option: its tokens


def option_tree(context: list[int], options: list[list[int]]) -> OptionTree:
    """The tree of ``context`` followed by each of ``options``.

    Arguments:
        context: token ids (at least one); options: each option's token ids (at least one each).
    """
    ids, positions, branch = list(context), list(range(len(context))), [0] * len(context)
    rows, targets = [], []
    for number, option in enumerate(options, start=1):
        start = len(ids)
        rows.append(torch.tensor([len(context) - 1, *range(start, start + len(option) - 1)]))
        targets.append(torch.tensor(option))
        ids += option
        positions += range(len(context), len(context) + len(option))
        branch += [number] * len(option)
    order, of = torch.arange(len(ids)), torch.tensor(branch)
    mask = (order[None, :] <= order[:, None]) & ((of[None, :] == 0) | (of[None, :] == of[:, None]))
    return OptionTree(torch.tensor([ids]), torch.tensor([positions]), mask, rows, targets)


def choice_scores(forward: TreeForward, encode: Encode, questions: list[Question]) -> ChoiceScores:
    """The model's pick for each question: one pass over the question's ``option_tree``.

    Arguments:
        forward: a token tree → its logits (``TreeForward``); encode: text → ids without special tokens;
        questions: the set.
    """
    picks = []
    with torch.no_grad():
        for question in questions:
            tree = option_tree(encode(f"Question: {question.text}\nAnswer:"),
                               [encode(f" {option}") for option in question.options])
            logprobs = forward(tree.ids, tree.positions, tree.mask)[0].float().log_softmax(-1)
            scores = [float(logprobs[rows, targets].sum())
                      for rows, targets in zip(tree.rows, tree.targets, strict=True)]
            picks.append(max(range(len(scores)), key=scores.__getitem__))
    return ChoiceScores(tuple(picks))
