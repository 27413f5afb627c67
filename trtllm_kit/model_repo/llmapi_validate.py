"""The rules of an llmapi repository, checked before tritonserver sees it: one ``tensorrt_llm`` Python model whose
``config.pbtxt`` declares upstream's ``llmapi`` tensors and mirrors ``model.yaml``'s ``decoupled``; a
``model.yaml`` of ``TorchLlmArgs`` fields with a complete ``triton_config``; a ``model`` that is a unified
checkpoint (HF ``config.json`` and the safetensors its index lists) with TP/PP that divide the model; several
instances only with ``gpu_device_ids``, one group of tp x pp GPUs per instance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.errors import KitError
from trtllm_kit.llmapi.llm_args import check_llm_args
from trtllm_kit.mapping import check_tp
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.model_repo.report import ValidationReport
from trtllm_kit.names import LLM_ARGS_FILE, TRTLLM_MODEL
from trtllm_kit.spec.gpu_groups import check_gpu_groups, parse_gpu_device_ids

REQUIRED_INPUTS = ("text_input", "streaming", "sampling_param_max_tokens", "sampling_param_temperature",
                   "sampling_param_top_k", "sampling_param_top_p", "sampling_param_stop", "return_finish_reason",
                   "stop")
REQUIRED_OUTPUTS = ("text_output", "finish_reason")


def is_llmapi_repository(repo: Path) -> bool:
    """Whether ``repo`` holds the llmapi model (a ``model.yaml`` beside a Python ``tensorrt_llm``)."""
    return (repo / TRTLLM_MODEL / LLM_ARGS_FILE).is_file()


def validate_llmapi_repository(repo: Path, checkpoint: Path | None = None) -> list[str]:
    """Every broken rule as one sentence (empty: the repository is sound).

    Arguments:
        repo: the repository; checkpoint: the unified checkpoint to check against (default: ``model.yaml``'s
        ``model``).
    """
    model_dir = repo / TRTLLM_MODEL
    try:
        config = parse_config((model_dir / "config.pbtxt").read_text())
        values = yaml.safe_load((model_dir / LLM_ARGS_FILE).read_text())
    except (OSError, yaml.YAMLError, ValueError) as exc:
        return [f"{model_dir}: config.pbtxt or 1/model.yaml cannot be read ({exc})"]
    problems = []
    if config.backend != "python" or not (model_dir / "1" / "model.py").is_file():
        problems.append(f"{model_dir}: the llmapi model is a Python-backend model with 1/model.py")
    if not isinstance(values, dict) or not isinstance(values.get("triton_config"), dict):
        return [*problems, f"{model_dir}/1/model.yaml has no triton_config mapping (model.py needs it)"]
    triton = values["triton_config"]
    for key in ("max_batch_size", "decoupled"):
        if key not in triton:
            problems.append(f"{model_dir}/1/model.yaml: triton_config lacks {key}")
    if bool(triton.get("decoupled")) != config.model_transaction_policy.decoupled:
        problems.append(f"{model_dir}: model.yaml says decoupled {triton.get('decoupled')} but config.pbtxt "
                        f"{config.model_transaction_policy.decoupled}; servers start with "
                        "--disable-auto-complete-config, so both must agree")
    if config.max_batch_size != 0 or triton.get("max_batch_size", 0) != 0:
        problems.append(f"{model_dir}: max_batch_size must be 0 (the llmapi model does not batch in Triton)")
    names = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    problems += [f"{model_dir}/config.pbtxt lacks the llmapi input {n}" for n in REQUIRED_INPUTS if n not in names]
    problems += [f"{model_dir}/config.pbtxt lacks the llmapi output {n}" for n in REQUIRED_OUTPUTS if n not in outputs]
    try:
        check_llm_args(values, triton=True)
    except KitError as exc:
        problems.append(f"{model_dir}/1/model.yaml: {exc}")
    problems += _instance_problems(model_dir, config, values)
    ckpt = checkpoint or Path(str(values.get("model", "")))
    problems += _checkpoint_problems(ckpt, int(values.get("tensor_parallel_size", 1)))
    return problems


def _instance_problems(model_dir: Path, config: Any, values: dict[str, Any]) -> list[str]:
    """Several instances need ``gpu_device_ids`` with one group of tp x pp GPUs per instance."""
    count = sum(group.count or 1 for group in config.instance_group) or 1
    ids = config.parameters["gpu_device_ids"].string_value if "gpu_device_ids" in config.parameters else ""
    if not ids:
        return [] if count == 1 else [f"{model_dir}/config.pbtxt: {count} instances but no gpu_device_ids "
                                      "parameter; each instance's LLM needs its own GPUs (0,1;2,3)"]
    try:
        groups = parse_gpu_device_ids(ids)
        check_gpu_groups(groups, int(values.get("tensor_parallel_size", 1)),
                         int(values.get("pipeline_parallel_size", 1)))
    except KitError as exc:
        return [f"{model_dir}/config.pbtxt: {exc}"]
    if len(groups) != count:
        return [f"{model_dir}/config.pbtxt: gpu_device_ids has {len(groups)} GPU group(s) but instance_group "
                f"{count} instance(s); give one group per instance"]
    return []


def _checkpoint_problems(ckpt: Path, tp_size: int) -> list[str]:
    index = ckpt / "model.safetensors.index.json"
    if not (ckpt / "config.json").is_file() or not index.is_file():
        return [f"model {ckpt} is not a unified checkpoint (config.json and model.safetensors.index.json)"]
    missing = sorted({f for f in json.loads(index.read_text())["weight_map"].values() if not (ckpt / f).is_file()})
    if missing:
        return [f"model {ckpt}: {missing[0]} listed in the index is missing"]
    config = json.loads((ckpt / "config.json").read_text())
    heads = int(config["num_attention_heads"])
    try:
        check_tp(heads, int(config.get("num_key_value_heads") or heads), int(config["intermediate_size"]), tp_size)
    except KitError as exc:
        return [f"model {ckpt}: {exc}"]
    return []


def llmapi_report(repo: Path) -> ValidationReport:
    """``validate_llmapi_repository``'s broken rules as a ``ValidationReport`` (errors of ``tensorrt_llm``), so
    ``trtllm-kit validate`` prints and exits for an llmapi repository as for the engine target's.

    Arguments:
        repo: the llmapi repository.
    """
    report = ValidationReport(repo)
    for problem in validate_llmapi_repository(repo):
        report.add("error", TRTLLM_MODEL, "llmapi", problem)
    return report
