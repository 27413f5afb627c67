"""The unquantized HF model verify holds a checkpoint to: loaded with the checkpoint's rounded weights, run on the
prompts, the held-out windows and the multiple-choice set once per model and inputs (``reference_cache``)."""

from __future__ import annotations

from pathlib import Path

import torch

from trtllm_kit.checkpoint.quality import Question, TreeForward, choice_scores
from trtllm_kit.checkpoint.reference_cache import Reference, cached_reference, reference_key
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.models.text_tokenizer import load_text_tokenizer


def load_hf_reference(hf_dir: Path, weight_dtype: torch.dtype, compute_dtype: torch.dtype) -> torch.nn.Module:
    """The HF model with weights rounded to the checkpoint dtype, computing in ``compute_dtype``.

    Loading in the checkpoint's dtype gives both sides the same rounded weights; the cast that follows gives
    them the same arithmetic.

    Arguments:
        hf_dir: the HF model directory; weight_dtype: the checkpoint dtype; compute_dtype: the compute dtype.
    """
    return load_causal_lm(hf_dir, weight_dtype).to(compute_dtype)


def reference_outputs(hf_dir: Path, weight_dtype: torch.dtype, compute_dtype: torch.dtype, prompts: list[list[int]],
                      windows: list[list[int]], questions: list[Question]) -> Reference:
    """The HF model's logits on ``prompts`` and ``windows`` and its picks on ``questions``: from the kit's cache when
    an entry of the same model files, dtypes, inputs and library versions is there, else computed and cached.

    Arguments:
        hf_dir: the HF model directory; weight_dtype: the checkpoint dtype; compute_dtype: the compute dtype;
        prompts: token-id lists; windows: the held-out windows' token ids (empty: none); questions: the
        multiple-choice set (empty: none).
    """
    key = reference_key(hf_dir, str(weight_dtype).removeprefix("torch."), str(compute_dtype).removeprefix("torch."),
                        prompts, windows, questions)

    def fits(found: Reference) -> bool:
        lengths = [len(ids) for ids in (*prompts, *windows)]
        shapes = [tuple(t.shape[:2]) for t in (*found.prompt_logits, *found.window_logits)]
        return shapes == [(1, n) for n in lengths] and len(found.picks) == len(questions)

    def compute() -> Reference:
        return computed_reference(hf_dir, weight_dtype, compute_dtype, prompts, windows, questions)

    return cached_reference(key, fits, compute)


def computed_reference(hf_dir: Path, weight_dtype: torch.dtype, compute_dtype: torch.dtype,
                       prompts: list[list[int]], windows: list[list[int]], questions: list[Question]) -> Reference:
    """The HF model run on the inputs (see ``reference_outputs``), without the cache.

    Arguments:
        as ``reference_outputs``.
    """
    model = load_hf_reference(hf_dir, weight_dtype, compute_dtype)

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return model(ids).logits

    with torch.no_grad():
        prompt_logits = [logits(torch.tensor([ids], dtype=torch.int64)) for ids in prompts]
        window_logits = [logits(torch.tensor([ids], dtype=torch.int64)) for ids in windows]
    picks = choice_scores(tree_forward(model), load_text_tokenizer(hf_dir).encode, questions).picks if questions else ()
    return Reference(prompt_logits, window_logits, picks)


def tree_forward(model: torch.nn.Module) -> TreeForward:
    """A transformers causal LM's logits over a token tree (``quality.option_tree``): the tree's positions as
    ``position_ids`` and its mask as a custom 4D attention mask, which transformers takes as given (0 where a token
    sees another, the dtype's lowest value elsewhere, added to the scores by eager attention).

    Arguments:
        model: a transformers causal LM (or one ModelOpt quantized in place).
    """
    def forward(ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        dtype = next(model.parameters()).dtype
        bias = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        return model(ids, position_ids=positions, attention_mask=bias[None, None], use_cache=False).logits

    return forward
