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

Forward = Callable[[torch.Tensor], torch.Tensor]
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


def choice_scores(forward: Forward, encode: Encode, questions: list[Question]) -> ChoiceScores:
    """The model's pick for each question.

    Arguments:
        forward: token ids [1, T] → logits [1, T, V]; encode: text → ids without special tokens;
        questions: the set.
    """
    picks = []
    with torch.no_grad():
        for question in questions:  # the options in one batch, padded at the end (which no earlier position sees)
            context = encode(f"Question: {question.text}\nAnswer:")
            answers = [encode(f" {option}") for option in question.options]
            width = len(context) + max(len(a) for a in answers)
            ids = torch.tensor([context + a + [0] * (width - len(context) - len(a)) for a in answers])
            logprobs = forward(ids).float().log_softmax(-1)
            scores = [float(logprobs[i, len(context) - 1 + torch.arange(len(a)), torch.tensor(a)].sum())
                      for i, a in enumerate(answers)]
            picks.append(max(range(len(scores)), key=scores.__getitem__))
    return ChoiceScores(tuple(picks))
