"""Draft-target speculation in a Triton repository, in upstream's ``spec_decode`` layout
(``examples/draft_target_model/README.md``): the target engine in ``tensorrt_llm``, the draft engine in
``tensorrt_llm_draft`` (the same configuration over the draft's engine directory), the BLS naming both
(``tensorrt_llm_model_name``, ``tensorrt_llm_draft_model_name``), taking ``num_draft_tokens`` and
``use_draft_logits`` per request and returning the acceptance figures, and the ensemble routed through the BLS
(its one step, the same inputs and outputs), so both text entry points speculate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.artifact import EngineLimits
from trtllm_kit.model_repo.configs import model_input, model_output, set_parameters, tensorrt_llm_config
from trtllm_kit.model_repo.report import ValidationReport
from trtllm_kit.names import BLS_MODEL, DRAFT_MODEL, ENSEMBLE_MODEL, TRTLLM_MODEL
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.triton_models.draft_rounds import DRAFT_MODEL_PARAMETER, NUM_DRAFT_TOKENS, USE_DRAFT_LOGITS
from trtllm_kit.wire.tensor import Tensor

# the BLS's per-request speculation inputs (upstream's tensorrt_llm_bls/config.pbtxt), after the text interface
BLS_DRAFT_INPUTS = (Tensor(NUM_DRAFT_TOKENS, "INT32", (1,), False), Tensor(USE_DRAFT_LOGITS, "BOOL", (1,), False))
# and its acceptance outputs (with return_perf_metrics)
BLS_DRAFT_OUTPUTS = (Tensor("acceptance_rate", "FP32", (1,)), Tensor("total_accepted_draft_tokens", "INT32", (1,)),
                     Tensor("total_draft_tokens", "INT32", (1,)))


@dataclass(frozen=True)
class DraftServing:
    """The draft engine a repository serves beside its target: its limits and ``gpt_model_path``."""

    limits: EngineLimits
    model_path: Path  # the draft's engine directory as the server sees it


def draft_config(draft: DraftServing, options: RepoOptions) -> mc.ModelConfig:
    """``tensorrt_llm_draft``: the target's in-flight batching configuration over the draft's engine.

    Arguments:
        draft: the draft engine; options: the repository's options, resolved against the target.
    """
    config = tensorrt_llm_config(draft.limits, options, draft.model_path)
    config.name = DRAFT_MODEL
    return config


def speculate_through_bls(configs: dict[str, mc.ModelConfig], draft: DraftServing, options: RepoOptions) -> None:
    """Add ``tensorrt_llm_draft``, name it in the BLS with its speculation inputs, and route the ensemble through
    the BLS.

    Arguments:
        configs: the text repository's configs by model name (changed in place); draft: the draft engine;
        options: the resolved repository options.
    """
    configs[DRAFT_MODEL] = draft_config(draft, options)
    bls = configs[BLS_MODEL]
    bls.input.extend(model_input(t, scalar_reshape=t.data_type == "BOOL") for t in BLS_DRAFT_INPUTS)
    bls.output.extend(model_output(t) for t in BLS_DRAFT_OUTPUTS)
    set_parameters(bls, {DRAFT_MODEL_PARAMETER: DRAFT_MODEL, "tensorrt_llm_model_name": TRTLLM_MODEL})
    ensemble = configs[ENSEMBLE_MODEL]
    ensemble.input.extend(model_input(t) for t in BLS_DRAFT_INPUTS)
    ensemble.output.extend(model_output(t) for t in BLS_DRAFT_OUTPUTS)
    del ensemble.ensemble_scheduling.step[:]
    step = ensemble.ensemble_scheduling.step.add(model_name=BLS_MODEL, model_version=-1)
    for tensor in ensemble.input:
        step.input_map[tensor.name] = tensor.name
    for tensor in ensemble.output:
        step.output_map[tensor.name] = tensor.name


def check_draft_model(repo: Path, configs: dict[str, mc.ModelConfig], report: ValidationReport,
                      staged_root: Path | None = None) -> None:
    """The draft model the BLS names is in the repository, and its ``gpt_model_path`` holds an engine.

    Arguments:
        repo: the repository; configs: the parsed configs by model name; report: where findings go;
        staged_root: for a repository still being built, the staging directory its engine directories are in
        (``gpt_model_path`` names where they will be).
    """
    bls = configs.get(BLS_MODEL)
    name = bls.parameters[DRAFT_MODEL_PARAMETER].string_value if bls and DRAFT_MODEL_PARAMETER in bls.parameters \
        else ""
    if not name:
        return
    draft = configs.get(name)
    if draft is None:
        report.add("error", BLS_MODEL, "draft", f"{BLS_MODEL} names the draft model {name!r}, which is not in "
                   f"{repo}; rebuild with --speculative draft-target.")
        return
    engine_dir = Path(draft.parameters["gpt_model_path"].string_value) if "gpt_model_path" in draft.parameters \
        else None
    if engine_dir is not None and staged_root is not None:
        engine_dir = staged_root / engine_dir.name
    if engine_dir is None or not (engine_dir / "config.json").is_file():
        report.add("error", name, "gpt_model_path", f"{name}'s gpt_model_path {engine_dir} holds no draft engine "
                   "(config.json); rebuild the draft with trtllm-kit build --speculative draft-target.")

