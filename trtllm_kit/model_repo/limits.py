"""What the ``tensorrt_llm`` model can run: read from the engine ``config.json`` or, for the CPU target, from
the checkpoint and the runtime settings chosen for it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.defaults import DEFAULT_TOKENS_PER_BLOCK as TOKENS_PER_BLOCK
from trtllm_kit.errors import KitError
from trtllm_kit.jsonfile import read_json

CPU_MAX_BATCH_SIZE = 8
CPU_MAX_NUM_TOKENS = 2048
CPU_MAX_SEQ_LEN = 1024


@dataclass(frozen=True)
class EngineLimits:
    """Shapes and features fixed when the engine was built (or chosen for the CPU runtime)."""

    target: str  # "engine" or "cpu"
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
    def num_rank_files(self) -> int:
        pattern = "rank*.engine" if self.target == "engine" else "rank*.safetensors"
        return sum(1 for _ in self.model_dir.glob(pattern))

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["model_dir"] = self.model_dir.name  # "engines" or "checkpoint": built in a staging dir, then moved
        return values


def _read_json(path: Path) -> dict[str, Any]:
    return read_json(path, f"{path} does not exist; build the engine or checkpoint first (trtllm-kit build).")


def _enabled(value: Any) -> bool:
    """A plugin switch as engines record it: a bool, or the ``enable``/``disable`` spelling of the CLI."""
    return value.strip().lower() in ("enable", "true", "1") if isinstance(value, str) else bool(value)


def engine_limits(engine_dir: Path) -> EngineLimits:
    """Read a TensorRT-LLM 1.x engine ``config.json`` (``pretrained_config`` + ``build_config``).

    Arguments:
        engine_dir: the directory holding ``config.json`` and ``rank*.engine``.
    """
    path = engine_dir / "config.json"
    config = _read_json(path)
    build, pretrained = config.get("build_config"), config.get("pretrained_config")
    if not isinstance(build, dict) or not isinstance(pretrained, dict):
        found = "builder_config (a pre-0.8 engine)" if "builder_config" in config else f"keys {sorted(config)}"
        raise KitError(f"{path} lacks build_config/pretrained_config (found {found}); rebuild the engine with "
                       "TensorRT-LLM 0.12–1.2.")
    plugin, mapping = build.get("plugin_config") or {}, pretrained.get("mapping") or {}
    return EngineLimits(
        target="engine", model_dir=engine_dir, max_batch_size=int(build["max_batch_size"]),
        max_num_tokens=int(build.get("max_num_tokens") or 8192), max_seq_len=int(build["max_seq_len"]),
        max_beam_width=int(build.get("max_beam_width", 1)),
        tokens_per_block=int(plugin.get("tokens_per_block", TOKENS_PER_BLOCK)),
        use_paged_context_fmha=_enabled(plugin.get("use_paged_context_fmha", False)),
        tp_size=int(mapping.get("tp_size", 1)), pp_size=int(mapping.get("pp_size", 1)),
        vocab_size=pretrained.get("vocab_size"))


def cpu_limits(ckpt_dir: Path, *, max_batch_size: int | None = None, max_num_tokens: int | None = None,
               max_seq_len: int | None = None, tokens_per_block: int | None = None) -> EngineLimits:
    """Limits for the CPU runtime over a checkpoint: the given values, else defaults sized for a CPU.

    Arguments:
        ckpt_dir: the TensorRT-LLM checkpoint; the other arguments override the defaults.
    """
    config = _read_json(ckpt_dir / "config.json")
    mapping = config.get("mapping") or {}
    positions = int(config.get("max_position_embeddings") or CPU_MAX_SEQ_LEN)
    return EngineLimits(
        target="cpu", model_dir=ckpt_dir, max_batch_size=max_batch_size or CPU_MAX_BATCH_SIZE,
        max_num_tokens=max_num_tokens or CPU_MAX_NUM_TOKENS, max_seq_len=max_seq_len or min(positions, CPU_MAX_SEQ_LEN),
        max_beam_width=1, tokens_per_block=tokens_per_block or TOKENS_PER_BLOCK, use_paged_context_fmha=True,
        tp_size=int(mapping.get("tp_size", 1)), pp_size=int(mapping.get("pp_size", 1)),
        vocab_size=config.get("vocab_size"))


def limits_from_dir(model_dir: Path, parameters: dict[str, str] | None = None) -> EngineLimits:
    """Limits of whatever ``gpt_model_path`` names: an engine directory, or a checkpoint for the CPU runtime
    (then the runtime's settings come from the config's ``parameters``).

    Arguments:
        model_dir: an engine or checkpoint directory; parameters: the ``tensorrt_llm`` string parameters.
    """
    config = _read_json(model_dir / "config.json")
    if "build_config" in config or "builder_config" in config:
        return engine_limits(model_dir)
    params = parameters or {}

    def number(key: str) -> int | None:
        value = params.get(key, "")
        return int(value) if value.isdigit() else None

    return cpu_limits(model_dir, max_batch_size=number("max_batch_size"), max_num_tokens=number("max_num_tokens"),
                      max_seq_len=number("max_seq_len"), tokens_per_block=number("tokens_per_block"))
