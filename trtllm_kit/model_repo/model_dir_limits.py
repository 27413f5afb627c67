"""The CPU runtime's default limits, and the reader of a model directory's limits (``EngineLimits``) that
repository validation is given: each target reads its own kind of directory (``trtllm_kit.targets``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trtllm_kit.artifact import EngineLimits

CPU_MAX_BATCH_SIZE = 8
CPU_MAX_NUM_TOKENS = 2048
CPU_MAX_SEQ_LEN = 1024


# reads the limits of the model directory ``gpt_model_path`` names, given the tensorrt_llm string parameters
# (``trtllm_kit.targets.limits_from_dir``: each target reads its own kind of directory)
LimitsReader = Callable[[Path, dict[str, str]], EngineLimits]
