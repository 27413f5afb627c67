"""What a served repository accepts per request, read from its ``tensorrt_llm`` model: ``max_seq_len`` (prompt
plus output tokens), so the frontend refuses a request that cannot fit with a 400 before it reaches the engine.
The llmapi target states it in ``tensorrt_llm/1/model.yaml`` (the ``LLM()`` arguments)."""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.engine.config_file import read_engine_config
from trtllm_kit.errors import KitError
from trtllm_kit.names import LLM_ARGS_FILE, TRTLLM_MODEL


def max_seq_len(repo: Path) -> int | None:
    """The ``tensorrt_llm`` model's ``max_seq_len``: its parameter (the CPU runtime), else the engine's
    ``config.json`` (``build_config.max_seq_len``), else the llmapi model's ``model.yaml``; None when none says.

    Arguments:
        repo: the model repository.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    path = repo / TRTLLM_MODEL / "config.pbtxt"
    try:
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError):
        return None
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    if parameters.get("max_seq_len", "").isdigit():
        return int(parameters["max_seq_len"])
    if "gpt_model_path" not in parameters:
        return _llm_args_max_seq_len(repo / TRTLLM_MODEL / LLM_ARGS_FILE)
    engine_dir = Path(parameters.get("gpt_model_path", ""))
    engine_dir = engine_dir if engine_dir.is_absolute() else repo / TRTLLM_MODEL / engine_dir
    try:
        build = read_engine_config(engine_dir, f"{engine_dir}/config.json does not exist").build
    except (KitError, OSError, ValueError):
        return None
    value = build.get("max_seq_len")
    return value if isinstance(value, int) and value > 0 else None


def _llm_args_max_seq_len(path: Path) -> int | None:
    """``max_seq_len`` of an llmapi ``model.yaml``, or None when it is absent or unreadable."""
    import yaml

    try:
        args = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    value = args.get("max_seq_len") if isinstance(args, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
