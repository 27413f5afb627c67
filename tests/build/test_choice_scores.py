"""Multiple-choice scoring over an option tree: one pass over the question and all its options gives each option the
log-probabilities it gets as a sequence of its own, for the kit's runtime (TP 2, a checkpoint's families) and for
transformers (the reference, with a custom 4D mask); an option never sees another."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.checkpoint.quality import Question, TreeForward, choice_scores, option_tree
from trtllm_kit.checkpoint.reference import tree_forward
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.models.text_tokenizer import load_text_tokenizer
from trtllm_kit.runtime.model import CheckpointModel

CONTEXT = [5, 17, 230, 9, 44, 3]
OPTIONS = [[12, 800], [61], [7, 7, 7, 1000], [300, 2]]


def alone(forward: TreeForward, context: list[int], option: list[int]) -> float:
    """An option's summed log-probability as its own causal sequence."""
    ids = context + option
    length = len(ids)
    logits = forward(torch.tensor([ids]), torch.arange(length)[None],
                     torch.ones(length, length, dtype=torch.bool).tril())
    logprobs = logits[0].float().log_softmax(-1)
    return float(logprobs[torch.arange(len(context) - 1, length - 1), torch.tensor(option)].sum())


def in_tree(forward: TreeForward, context: list[int], options: list[list[int]]) -> list[float]:
    tree = option_tree(context, options)
    logprobs = forward(tree.ids, tree.positions, tree.mask)[0].float().log_softmax(-1)
    return [float(logprobs[rows, targets].sum()) for rows, targets in zip(tree.rows, tree.targets, strict=True)]


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen2", "tiny-phi3"])
def family(request: pytest.FixtureRequest) -> Path:
    return builtin_dir(request.param)


@pytest.fixture(scope="module")
def forwards(family: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TreeForward]:
    torch.set_num_threads(1)
    ckpt = tmp_path_factory.mktemp("ckpt") / family.name
    convert_checkpoint(family, ckpt, tp_size=2, dtype="float32")
    return {"kit": CheckpointModel.load(ckpt, torch.float32).forward,
            "transformers": tree_forward(load_causal_lm(family, torch.float32))}


@pytest.mark.parametrize("side", ["kit", "transformers"])
def test_each_option_scores_as_its_own_sequence(forwards: dict[str, TreeForward], side: str) -> None:
    forward = forwards[side]
    want = [alone(forward, CONTEXT, option) for option in OPTIONS]
    assert in_tree(forward, CONTEXT, OPTIONS) == pytest.approx(want, abs=1e-4)
    # no option sees another: changing one leaves the others' scores as they were
    changed = in_tree(forward, CONTEXT, [OPTIONS[0], [99, 98, 97], *OPTIONS[2:]])
    assert changed[:1] + changed[2:] == pytest.approx(want[:1] + want[2:], abs=1e-4)


def test_the_tree_holds_the_context_once_and_each_option_after_it() -> None:
    tree = option_tree([1, 2, 3], [[4, 5], [6]])
    assert tree.ids.tolist() == [[1, 2, 3, 4, 5, 6]] and tree.positions.tolist() == [[0, 1, 2, 3, 4, 3]]
    assert tree.mask.int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                                        [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 1]]
    assert [r.tolist() for r in tree.rows] == [[2, 3], [2]] and [t.tolist() for t in tree.targets] == [[4, 5], [6]]


def test_the_pick_is_the_likeliest_option(family: Path, forwards: dict[str, TreeForward]) -> None:
    """Words the tokenizer splits into several tokens; the kit's picks are transformers' on the same tree."""
    encode = load_text_tokenizer(family).encode
    questions = [Question("Which is a colour?", ("blue", "table", "running quickly", "seven")),
                 Question("Pick a number.", ("three hundred", "cat"))]
    for question in questions:
        context = encode(f"Question: {question.text}\nAnswer:")
        scores = in_tree(forwards["kit"], context, [encode(f" {o}") for o in question.options])
        assert choice_scores(forwards["kit"], encode, [question]).picks == (scores.index(max(scores)),)
    assert choice_scores(forwards["kit"], encode, questions) == choice_scores(forwards["transformers"], encode,
                                                                              questions)
