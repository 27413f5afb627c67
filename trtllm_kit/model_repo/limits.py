"""What the ``tensorrt_llm`` model can run (``EngineLimits``); each target reads its own model directory
(``trtllm_kit.targets``): the engine ``config.json``, or the checkpoint and the CPU runtime's settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError
from trtllm_kit.jsonfile import read_json

CPU_MAX_BATCH_SIZE = 8
CPU_MAX_NUM_TOKENS = 2048
CPU_MAX_SEQ_LEN = 1024


@dataclass(frozen=True)
class EngineLimits:
    """Shapes and features fixed when the engine was built (or chosen for the CPU runtime)."""

    target: str  # a registered target name (trtllm_kit.targets)
    model_dir: Path  # the engine directory, or the checkpoint directory for "cpu"
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    max_beam_width: int
    tokens_per_block: int
    use_paged_context_fmha: bool
    tp_size: int
    pp_size: int
    vocab_size: int | None = None

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def rank_file_pattern(self) -> str:
        from trtllm_kit.targets import get_target

        return get_target(self.target).rank_file_pattern

    @property
    def num_rank_files(self) -> int:
        return sum(1 for _ in self.model_dir.glob(self.rank_file_pattern))

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["model_dir"] = self.model_dir.name  # "engines" or "checkpoint": built in a staging dir, then moved
        return values


def limits_from_dir(model_dir: Path, parameters: dict[str, str] | None = None) -> EngineLimits:
    """Limits of whatever ``gpt_model_path`` names, read by the target whose model directory it is (an engine
    directory, or a checkpoint for the CPU runtime, whose sizes then come from the config's ``parameters``).

    Arguments:
        model_dir: an engine or checkpoint directory; parameters: the ``tensorrt_llm`` string parameters.
    """
    from trtllm_kit.targets import target_for_model_dir

    path = model_dir / "config.json"
    config = read_json(path, f"{path} does not exist; build the engine or checkpoint first (trtllm-kit build).")
    target = target_for_model_dir(config)
    if target is None:
        raise KitError(f"{path} is neither an engine nor a TensorRT-LLM checkpoint config (keys {sorted(config)[:6]}); "
                       "point gpt_model_path at a build's engines/ or checkpoint/.")
    params = parameters or {}
    names = ("max_batch_size", "max_num_tokens", "max_seq_len", "tokens_per_block")
    return target.limits(model_dir, {k: int(params[k]) if params.get(k, "").isdigit() else None for k in names})
