"""What the ``tensorrt_llm`` model can run (``EngineLimits``); each target reads its own model directory
(``trtllm_kit.targets``): the engine ``config.json``, or the checkpoint and the CPU runtime's settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.layout import Mapping

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
    # what the target serves the model directory with, not limits: left out of ``to_dict``
    rank_file_pattern: str = field(default="rank*.engine", compare=False)  # one file per rank in model_dir
    slot_model: str | None = field(default=None, compare=False)  # the kit's Python model in the slot (None: C++)

    @property
    def mapping(self) -> Mapping:
        return Mapping(self.tp_size, self.pp_size)

    @property
    def world_size(self) -> int:
        return self.mapping.world_size

    @property
    def num_rank_files(self) -> int:
        return sum(1 for _ in self.model_dir.glob(self.rank_file_pattern))

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        del values["rank_file_pattern"], values["slot_model"]
        values["model_dir"] = self.model_dir.name  # "engines" or "checkpoint": built in a staging dir, then moved
        return values


# reads the limits of the model directory ``gpt_model_path`` names, given the tensorrt_llm string parameters
# (``trtllm_kit.targets.limits_from_dir``: each target reads its own kind of directory)
LimitsReader = Callable[[Path, dict[str, str]], EngineLimits]
