"""What a served repository accepts per request, read from its ``tensorrt_llm`` model: ``max_seq_len`` (prompt
plus output tokens), so the frontend refuses a request that cannot fit with a 400 before it reaches the engine,
and ``max_batch_size`` (sequences the engine runs at once), which bounds how many engine requests one OpenAI
request keeps in flight. The llmapi target states them in ``tensorrt_llm/1/model.yaml`` (the ``LLM()``
arguments)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError
from trtllm_kit.names import LLM_ARGS_FILE, TRTLLM_MODEL
from trtllm_kit.trtllm_build.config_file import read_engine_config


def max_seq_len(repo: Path) -> int | None:
    """The ``tensorrt_llm`` model's ``max_seq_len``: its parameter (the CPU runtime), else the engine's
    ``config.json`` (``build_config.max_seq_len``), else the llmapi model's ``model.yaml``; None when none says.

    Arguments:
        repo: the model repository.
    """
    config = _model_config(repo)
    if config is None:
        return None
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    if parameters.get("max_seq_len", "").isdigit():
        return int(parameters["max_seq_len"])
    if "gpt_model_path" not in parameters:
        return _llm_args_int(repo / TRTLLM_MODEL / LLM_ARGS_FILE, "max_seq_len")
    engine_dir = Path(parameters.get("gpt_model_path", ""))
    engine_dir = engine_dir if engine_dir.is_absolute() else repo / TRTLLM_MODEL / engine_dir
    try:
        build = read_engine_config(engine_dir, f"{engine_dir}/config.json does not exist").build
    except (KitError, OSError, ValueError):
        return None
    value = build.get("max_seq_len")
    return value if isinstance(value, int) and value > 0 else None


def max_batch_size(repo: Path) -> int | None:
    """The ``tensorrt_llm`` model's ``max_batch_size``: its config's (the CPU runtime and the C++ backend), else the
    llmapi model's ``model.yaml``; None when none says.

    Arguments:
        repo: the model repository.
    """
    config = _model_config(repo)
    if config is None:
        return None
    if config.max_batch_size > 0:
        return int(config.max_batch_size)
    return _llm_args_int(repo / TRTLLM_MODEL / LLM_ARGS_FILE, "max_batch_size")


def _model_config(repo: Path) -> Any:
    """The ``tensorrt_llm`` model's parsed ``config.pbtxt`` (a ``ModelConfig``), or None when it is unreadable."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    try:
        return text_format.Parse((repo / TRTLLM_MODEL / "config.pbtxt").read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError):
        return None


def _llm_args_int(path: Path, name: str) -> int | None:
    """The positive integer field ``name`` of an llmapi ``model.yaml``, or None when it is absent or
    unreadable."""
    import yaml

    try:
        args = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    value = args.get(name) if isinstance(args, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
