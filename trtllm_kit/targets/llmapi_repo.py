"""The llmapi target's Triton repository: one ``tensorrt_llm`` Python model (``config.pbtxt``, ``1/model.py``,
``1/model.yaml``). Its tensors are the wire's llmapi dialect: upstream's ``llmapi`` interface (docs/llmapi.md §1.4)
plus the token ids, counts, evaluation, priority, LoRA and disaggregation tensors the kit's clients send.
``config.pbtxt`` mirrors ``triton_config.decoupled`` because servers start with
``--disable-auto-complete-config``, and holds ``gpu_device_ids`` when several instances run."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.artifact import LlmapiRepoOptions, RepoRecord
from trtllm_kit.checkpoint.trtllm_config import precision_of
from trtllm_kit.errors import KitError
from trtllm_kit.llmapi.llm_args import check_llm_args
from trtllm_kit.llmapi.recipe import LlmapiRecipe, make_recipe
from trtllm_kit.llmapi.serve_config import COMMAND_FILE, OPTIONS_FILE, dump_yaml, model_yaml, serve_argv
from trtllm_kit.model_repo.configs import model_input, model_output, parse_config, to_text
from trtllm_kit.model_repo.llmapi_validate import validate_llmapi_repository
from trtllm_kit.model_repo.repository import python_source
from trtllm_kit.names import SERVE_DIR, TRTLLM_MODEL
from trtllm_kit.spec.gpu_groups import GpuGroups, describe, format_groups, parse_gpu_device_ids
from trtllm_kit.targets.base import BuildContext, EngineSetup, Target
from trtllm_kit.wire.llmapi import request_tensors
from trtllm_kit.wire.llmapi_response import RESPONSE_TENSORS

SCHEMA = "tensorrt_llm llmapi (Python backend over the LLM API), TensorRT-LLM >= 1.0"
SOURCE = "tensorrt_llm_llmapi.py"
GPU_DEVICE_IDS = "gpu_device_ids"  # config.pbtxt parameter: one ;-separated group of GPU ids per instance
INPUTS = request_tensors()  # the wire's llmapi inputs (trtllm_kit/wire/llmapi.py), in its order
OUTPUTS = RESPONSE_TENSORS  # and outputs (trtllm_kit/wire/llmapi_response.py)


def llmapi_config(decoupled: bool, gpu_groups: GpuGroups = ()) -> mc.ModelConfig:
    """``config.pbtxt`` of the ``tensorrt_llm`` llmapi model.

    Arguments:
        decoupled: the transaction policy (as ``model.yaml``'s ``triton_config.decoupled``);
        gpu_groups: the GPUs of each instance (one ``LLM`` each; empty: one instance on the visible GPUs).
    """
    config = mc.ModelConfig(name=TRTLLM_MODEL, backend="python", max_batch_size=0)
    config.model_transaction_policy.decoupled = decoupled
    config.input.extend(model_input(t) for t in INPUTS)
    config.output.extend(model_output(t) for t in OUTPUTS)
    # KIND_CPU: each instance is a Python stub process; its GPUs come from gpu_device_ids, not from Triton
    config.instance_group.add(count=max(1, len(gpu_groups)), kind=mc.ModelInstanceGroup.KIND_CPU)
    if gpu_groups:
        config.parameters[GPU_DEVICE_IDS].string_value = format_groups(gpu_groups)
    return config


def write_llmapi_repository(repo_dir: Path, model_values: dict, decoupled: bool, gpu_groups: GpuGroups = ()) -> None:
    """Write the repository into the new directory ``repo_dir``.

    Arguments:
        repo_dir: where; model_values: ``model.yaml``; decoupled: mirrored into ``config.pbtxt``;
        gpu_groups: the GPUs of each instance (empty: one instance).
    """
    config = llmapi_config(decoupled, gpu_groups)
    text = to_text(config)
    if parse_config(text) != config:  # internal invariant of the generator
        raise AssertionError("tensorrt_llm/config.pbtxt does not round-trip through text_format")
    version = repo_dir / TRTLLM_MODEL / "1"
    version.mkdir(parents=True)
    (repo_dir / TRTLLM_MODEL / "config.pbtxt").write_text(text)
    shutil.copy2(python_source(SOURCE), version / "model.py")
    (version / "model.yaml").write_text(dump_yaml(model_values))


def llmapi_repo_stage(ctx: BuildContext, target: Target) -> RepoRecord:
    """``repo/`` for the llmapi target, validated before the build output is moved into place.

    Arguments:
        ctx: the build; target: the llmapi target.
    """
    assert ctx.engine is not None
    recipe = recipe_for(ctx, ctx.engine)
    model_path = ctx.spec.out.absolute() / target.model_dir
    values = model_yaml(recipe, model_path, ctx.spec.repo.decoupled)
    ids = ctx.spec.repo.gpu_device_ids
    groups = parse_gpu_device_ids(ids) if ids is not None else ()
    write_llmapi_repository(ctx.out / "repo", values, ctx.spec.repo.decoupled, groups)
    problems = validate_llmapi_repository(ctx.out / "repo", checkpoint=ctx.out / target.model_dir)
    if problems:
        raise KitError(f"the generated repository fails validation: {problems[0]}")
    args = recipe.args
    limits = target.limits(ctx.out / target.model_dir, {
        "max_batch_size": args["max_batch_size"], "max_num_tokens": args["max_num_tokens"],
        "max_seq_len": args["max_seq_len"], "tokens_per_block": args["kv_cache_config"]["tokens_per_block"],
        "tp_size": ctx.spec.build.tp, "pp_size": ctx.spec.build.pp})
    ctx.reporter.note(f"repo: llmapi target, one tensorrt_llm Python model, decoupled {ctx.spec.repo.decoupled}"
                      + (f"; {describe(groups)}" if groups else ""))
    return RepoRecord(dir="repo", schema=SCHEMA, target=target.name, models=[TRTLLM_MODEL], text=True,
                      gpt_model_path=str(model_path), limits=limits,
                      options=LlmapiRepoOptions(decoupled=ctx.spec.repo.decoupled, llm_args=args,
                                                instances=max(1, len(groups)),
                                                gpu_device_ids=format_groups(groups) if groups else None))


def recipe_for(ctx: BuildContext, setup: EngineSetup) -> LlmapiRecipe:
    """The recipe of this build (the plan's GPU, or none).

    Arguments:
        ctx: the build; setup: the settled engine stage.
    """
    gpu = setup.build_gpu
    return make_recipe(ctx.spec, ctx.model.hf, ctx.model.family, precision_of(ctx.spec, ctx.model.hf), gpu,
                       setup.lora)


def write_serve_config(ctx: BuildContext, setup: EngineSetup) -> list[str]:
    """Write ``trtllm-serve/extra_llm_api_options.yaml`` and ``command.sh``; returns the command's argv.

    Arguments:
        ctx: the build (its staging directory is ``ctx.out``); setup: the settled engine stage.
    """
    recipe = recipe_for(ctx, setup)
    for note in recipe.notes:
        ctx.reporter.note(f"llmapi: {note}")
    check_llm_args(recipe.args)
    serve_dir = ctx.out / SERVE_DIR
    serve_dir.mkdir()
    (serve_dir / OPTIONS_FILE).write_text(dump_yaml(recipe.args))
    final = ctx.spec.out.absolute()
    argv = serve_argv(final / "checkpoint", final / SERVE_DIR / OPTIONS_FILE)
    (serve_dir / COMMAND_FILE).write_text("#!/bin/sh\nexec " + shlex.join(argv) + ' "$@"\n')
    (serve_dir / COMMAND_FILE).chmod(0o755)
    return argv
