"""The llmapi target's serving configuration: the ``TorchLlmArgs`` of the recipe written as
``trtllm-serve/extra_llm_api_options.yaml`` with the exact ``trtllm-serve`` command line, and as the Triton
model's ``model.yaml`` (the same keys plus ``model`` and ``triton_config``). Every key passes
``check_llm_args`` before it is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.llmapi.llm_args import check_llm_args
from trtllm_kit.llmapi.recipe import LlmapiRecipe

OPTIONS_FILE = "extra_llm_api_options.yaml"
COMMAND_FILE = "command.sh"
CANCELLATION_CHECK_PERIOD_MS = 100


def dump_yaml(values: dict[str, Any]) -> str:
    """YAML in key order, block style.

    Arguments:
        values: the mapping.
    """
    return yaml.safe_dump(values, sort_keys=False, default_flow_style=False)


def serve_argv(model_path: Path, options: Path, host: str = "127.0.0.1", port: int = 8000) -> list[str]:
    """``trtllm-serve MODEL --host H --port P --extra_llm_api_options FILE`` (the YAML carries every setting).

    Arguments:
        model_path: the unified checkpoint; options: the YAML file; host, port: where it listens.
    """
    return ["trtllm-serve", str(model_path), "--host", host, "--port", str(port), "--backend", "pytorch",
            "--extra_llm_api_options", str(options)]


def model_yaml(recipe: LlmapiRecipe, model_path: Path, decoupled: bool) -> dict[str, Any]:
    """The Triton llmapi model's ``model.yaml``: ``model``, the recipe's arguments and ``triton_config``.

    Arguments:
        recipe: the build's recipe; model_path: the unified checkpoint as the server sees it;
        decoupled: streaming (mirrored into ``config.pbtxt``).
    """
    values = {"model": str(model_path), **recipe.args,
              "triton_config": {"max_batch_size": 0, "decoupled": decoupled,
                                "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS}}
    check_llm_args(values, triton=True)
    return values
