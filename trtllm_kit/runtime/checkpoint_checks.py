"""The checks a TensorRT-LLM checkpoint passes as the CPU runtime loads it: per rank, the tensors its file must
hold (names and shapes), the quantization's scales and stored dtypes, and replicated tensors equal on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trtllm_kit.errors import CheckpointError
from trtllm_kit.layout import QuantLayout, TensorSpec, rank_tensors
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.registry import family_of_checkpoint
from trtllm_kit.runtime.layers import Weights

STORED_DTYPES = {"int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn}  # quantized weights, checked on load


def expected_tensors(config: dict[str, Any], mapping: Mapping, source: str,
                     ) -> tuple[list[dict[str, TensorSpec]], list[dict[str, TensorSpec]]]:
    """Per rank, the tensors its file must hold: unquantized (names and shapes checked), and with the
    quantization's scales (names, and the dtype of int8/float8 weights checked).

    Arguments:
        config: the checkpoint ``config.json``; mapping: its layout; source: its path, for error messages.
    """
    family = family_of_checkpoint(config["architecture"], source)
    try:
        hf = family.hf_config_of_checkpoint(config)
    except KeyError as missing:
        raise CheckpointError(f"{source} lacks the key {missing.args[0]!r}.") from None
    split = int(config.get("embedding_sharding_dim", 0)) if config.get("use_parallel_embedding") else None
    dtype = str(config.get("dtype", "float32"))
    quant = QuantLayout.from_dict(config.get("quantization"))
    ranks = mapping.ranks()
    plain = [rank_tensors(hf, family, mapping, r, None, dtype, embedding_split=split) for r in ranks]
    full = [rank_tensors(hf, family, mapping, r, quant, dtype, embedding_split=split) for r in ranks]
    return plain, full


def check_rank(tensors: Weights, expected: dict[str, TensorSpec], path: Path) -> None:
    """Raise ``CheckpointError`` naming the file and the first missing or misshapen tensor."""
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{path} lacks the tensor {missing[0]!r}{more}; convert the checkpoint again.")
    for name, spec in expected.items():
        shape = spec.shape
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(tensors[name].shape)}, but "
                                  f"config.json implies {list(shape)}.")


def check_quantized(tensors: Weights, full: dict[str, TensorSpec], plain: dict[str, TensorSpec],
                     quantization: dict[str, Any], path: Path) -> None:
    """A quantized rank file holds every scale its algorithm needs, and weights of the algorithm's dtype."""
    missing = [name for name in full if name not in plain and name not in tensors]
    if missing:
        raise CheckpointError(f"{path} lacks the tensor {missing[0]!r} that quant_algo "
                              f"{quantization.get('quant_algo')} / kv_cache_quant_algo "
                              f"{quantization.get('kv_cache_quant_algo')} needs; convert the checkpoint again.")
    algo = quantization.get("quant_algo") or ""
    for name, spec in full.items():
        want = STORED_DTYPES.get(spec.dtype)
        if want is not None and tensors[name].dtype != want:
            raise CheckpointError(f"{path}: tensor {name!r} is {tensors[name].dtype}, but quant_algo {algo} "
                                  f"stores {want}; convert the checkpoint again.")


def check_replicas(ranks: list[Weights], config: dict[str, Any], mapping: Mapping, ckpt_dir: Path) -> None:
    """Replicated tensors (norms, row biases, the unsplit embedding) must be equal on every TP rank of a stage:
    the runtime reads rank 0's copy, while GPUs would silently diverge."""
    replicated: tuple[str, ...] = ("layernorm.weight", "ln_f.weight", "dense.bias", "proj.bias")
    if not config.get("use_parallel_embedding"):
        replicated += ("vocab_embedding.weight",)
    for rank, tensors in enumerate(ranks):
        first = ranks[mapping.rank(0, mapping.pp_rank(rank))]
        for name in (n for n in tensors if n.endswith(replicated) and tensors is not first):
            if not torch.isclose(tensors[name], first[name], rtol=0, atol=0, equal_nan=True).all():
                raise CheckpointError(f"{ckpt_dir}: the replicated tensor {name!r} differs between "
                                      f"rank{rank - rank % mapping.tp_size}.safetensors and rank{rank}.safetensors; "
                                      "convert the checkpoint again.")
