"""The serving targets, registered once: ``TARGETS`` by name, and ``choose_target`` (the one place ``auto`` is
resolved, with the reason in words). Adding a target is a module with a ``Target`` subclass plus a line here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_kit.artifact import EngineLimits
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.jsonfile import read_json
from trtllm_kit.targets.base import Target
from trtllm_kit.targets.cpu import CpuTarget
from trtllm_kit.targets.engine import EngineTarget
from trtllm_kit.targets.llmapi import LlmapiTarget

TARGETS: dict[str, Target] = {target.name: target for target in (EngineTarget(), CpuTarget(), LlmapiTarget())}
AUTO_ORDER = ("engine", "cpu")  # auto takes the first target this machine can build


def get_target(name: str) -> Target:
    """The registered target ``name``.

    Arguments:
        name: a target name as a spec or manifest records it.
    """
    try:
        return TARGETS[name]
    except KeyError:
        raise KitUsageError(f"target {name!r} is not one of {', '.join(TARGETS)}.") from None


def choose_target(requested: str, machine: Machine, *, plan_only: bool = False) -> tuple[Target, str]:
    """The target for ``--target requested`` on ``machine``, and why, in words.

    Arguments:
        requested: ``auto`` or a registered name.
        machine: ``detect_machine()``.
        plan_only: a plan runs no tool, so a named target's machine check is reported, not enforced.
    """
    if requested != "auto":
        target = get_target(requested)
        problem = target.machine_problem(machine)
        if problem is None:
            return target, f"target {target.name}: {target.chosen_because(machine)}"
        if not plan_only:
            raise KitError(problem)
        return target, f"target {target.name} (plan only; a build here would stop: {_lower(problem)})"
    problems: list[str] = []
    for name in AUTO_ORDER:
        target = TARGETS[name]
        problem = target.machine_problem(machine)
        if problem is None:
            return target, f"target auto → {target.name}: " + (_lower(problems[-1]) if problems else
                                                                target.chosen_because(machine))
        problems.append(problem)
    raise KitError(f"no target can be built here: {'; '.join(problems)}")


def target_for_model_dir(config: dict[str, Any]) -> Target | None:
    """The target whose model directory holds this ``config.json`` (engine or checkpoint), or None.

    Arguments:
        config: the parsed ``config.json`` under ``gpt_model_path``.
    """
    return next((t for t in TARGETS.values() if t.reads_model_dir(config)), None)


def limits_from_dir(model_dir: Path, parameters: dict[str, str] | None = None) -> EngineLimits:
    """Limits of whatever ``gpt_model_path`` names, read by the target whose model directory it is (an engine
    directory, or a checkpoint for the CPU runtime, whose sizes then come from the config's ``parameters``).

    Arguments:
        model_dir: an engine or checkpoint directory; parameters: the ``tensorrt_llm`` string parameters.
    """
    path = model_dir / "config.json"
    config = read_json(path, f"{path} does not exist; build the engine or checkpoint first (trtllm-kit build).")
    target = target_for_model_dir(config)
    if target is None:
        raise KitError(f"{path} is neither an engine nor a TensorRT-LLM checkpoint config (keys {sorted(config)[:6]}); "
                       "point gpt_model_path at a build's engines/ or checkpoint/.")
    params = parameters or {}
    names = ("max_batch_size", "max_num_tokens", "max_seq_len", "tokens_per_block")
    return target.limits(model_dir, {k: int(params[k]) if params.get(k, "").isdigit() else None for k in names})


def _lower(sentence: str) -> str:
    return sentence[:1].lower() + sentence[1:]


__all__ = ["AUTO_ORDER", "TARGETS", "Target", "choose_target", "get_target", "limits_from_dir", "target_for_model_dir"]
