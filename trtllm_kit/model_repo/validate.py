"""``trtllm-kit validate REPO``: the misconfigurations that otherwise surface at server start, as findings.

Each rule reads the parsed configs (and the engine or checkpoint they point at) and adds findings with one
sentence each: what is wrong, what was found, what to do. Any ``error`` finding fails validation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.artifact import MANIFEST, Artifact, EngineLimits
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.model_repo.model_dir_limits import LimitsReader
from trtllm_kit.model_repo.report import ValidationReport
from trtllm_kit.model_repo.spec_decode import check_draft_model
from trtllm_kit.model_repo.wiring import check_ensemble
from trtllm_kit.names import MODEL_NAMES, TOKENIZER_CORE_FILES, TRTLLM_MODEL

REQUIRED_MODELS = ("preprocessing", TRTLLM_MODEL, "postprocessing")
ENTRY_MODELS = ("ensemble", "tensorrt_llm_bls")
BATCHING_STRATEGIES = ("V1", "inflight_batching", "inflight_fused_batching")
PLACEHOLDER = re.compile(r"\$\{[^}]*\}?")


def _params(config: mc.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def _parse_files(repo: Path, report: ValidationReport) -> dict[str, mc.ModelConfig]:
    """Parse every ``*/config.pbtxt``; placeholders and parse errors become findings."""
    configs = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        name, text = path.parent.name, path.read_text()
        rel = f"{name}/config.pbtxt"
        for number, line in enumerate(text.splitlines(), 1):
            for match in PLACEHOLDER.finditer(line):
                report.add("error", name, "placeholder", f"{rel}:{number}:{match.start() + 1} holds the unfilled "
                           f"placeholder {match.group()}; regenerate the repository with trtllm-kit build.")
        try:
            config = parse_config(text)
        except text_format.ParseError as exc:
            report.add("error", name, "parse", f"{rel} is not a valid inference.ModelConfig ({exc}); fix that "
                       "line or regenerate the repository.")
            continue
        if config.name and config.name != name:
            report.add("error", name, "name", f"{rel} names the model {config.name!r} but its directory is "
                       f"{name!r}; Triton refuses the mismatch: rename one of them.")
        if not (path.parent / "1").is_dir():
            report.add("error", name, "layout", f"{name}/1/ is missing; Triton loads version 1 from it.")
        elif config.backend == "python" and not (path.parent / "1" / "model.py").is_file():
            report.add("error", name, "layout", f"{name}/1/model.py is missing for the python backend.")
        configs[name] = config
    present = {p.parent.name for p in repo.glob("*/config.pbtxt")}
    if present == {TRTLLM_MODEL}:
        report.add("warning", TRTLLM_MODEL, "layout", "the repository has only tensorrt_llm (the model had no "
                   "tokenizer), so clients send token ids; rebuild from a model with tokenizer files for text.")
        return configs
    for name in REQUIRED_MODELS:
        if name not in present:
            report.add("error", name, "layout", f"{name}/config.pbtxt is missing; every text request needs it.")
    if not present & set(ENTRY_MODELS):
        report.add("error", "ensemble", "layout", "neither ensemble nor tensorrt_llm_bls exists; clients have no "
                   "text entry point: regenerate the repository.")
    return configs


@dataclass(frozen=True)
class Expectation:
    """What the artifact that holds the repository records: its world size and the plan's KV-cache fraction."""

    world_size: int | None = None
    kv_cache_fraction: float | None = None

    @classmethod
    def of_artifact(cls, out: Path) -> Expectation:
        """Read from ``out/manifest.json``; nothing is expected when there is none or it cannot be read.

        Arguments:
            out: the directory that holds the repository.
        """
        if not (out / MANIFEST).is_file():
            return cls()
        try:
            artifact = Artifact.read(out)
        except KitError:
            return cls()
        return cls(world_size=artifact.layout.world_size, kv_cache_fraction=artifact.kv_cache_fraction)


def _check_engine(trt: mc.ModelConfig, limits: EngineLimits, report: ValidationReport,
                  expect: Expectation) -> None:
    params, where = _params(trt), f"{limits.model_dir}/config.json"
    if trt.max_batch_size > limits.max_batch_size:
        report.add("error", TRTLLM_MODEL, "max_batch_size", f"max_batch_size {trt.max_batch_size} exceeds the "
                   f"engine's {limits.max_batch_size} ({where}); set it to {limits.max_batch_size}.")
    if limits.num_rank_files != limits.world_size:
        kind = limits.rank_file_pattern
        report.add("error", TRTLLM_MODEL, "world_size", f"{where} says tp_size {limits.tp_size} × pp_size "
                   f"{limits.pp_size} = {limits.world_size} ranks but {limits.model_dir} holds "
                   f"{limits.num_rank_files} {kind} file(s); rebuild it.")
    if expect.world_size is not None and expect.world_size != limits.world_size:
        report.add("error", TRTLLM_MODEL, "world_size", f"the build manifest records tp×pp = {expect.world_size} "
                   f"but {where} has world size {limits.world_size}; the repository points at another build: "
                   "regenerate it.")
    for devices in filter(None, params.get("gpu_device_ids", "").split(";")):
        if len(devices.split(",")) != limits.world_size:
            report.add("error", TRTLLM_MODEL, "world_size", f"gpu_device_ids {devices!r} lists "
                       f"{len(devices.split(','))} GPU(s) but the engine needs world size tp×pp = "
                       f"{limits.world_size}; list exactly that many.")
    for key in ("enable_chunked_context", "enable_kv_cache_reuse"):
        if params.get(key, "").lower() == "true" and not limits.use_paged_context_fmha:
            report.add("error", TRTLLM_MODEL, "paged_context_fmha", f"{key} is true but the engine was built "
                       f"without use_paged_context_fmha ({where}); set {key} to false or rebuild with "
                       "--use_paged_context_fmha enable.")
    beam = params.get("max_beam_width", "1")
    if beam.isdigit() and int(beam) > limits.max_beam_width:
        report.add("error", TRTLLM_MODEL, "max_beam_width", f"max_beam_width {beam} exceeds the engine's "
                   f"{limits.max_beam_width}; lower it or rebuild with a larger --max_beam_width.")
    kv_tokens = params.get("max_tokens_in_paged_kv_cache", "")
    if kv_tokens.isdigit() and int(kv_tokens) < limits.max_seq_len:
        report.add("error", TRTLLM_MODEL, "kv_cache", f"max_tokens_in_paged_kv_cache {kv_tokens} is below the "
                   f"engine's max_seq_len {limits.max_seq_len}, so one full-length sequence cannot fit; raise it.")


def _check_trtllm(trt: mc.ModelConfig, report: ValidationReport, model_dir: Path | None,
                  expect: Expectation, read_limits: LimitsReader) -> EngineLimits | None:
    params = _params(trt)
    strategy = params.get("gpt_model_type")
    if strategy not in BATCHING_STRATEGIES:
        report.add("error", TRTLLM_MODEL, "gpt_model_type", f"gpt_model_type is {strategy!r}; the backend "
                   f"requires one of {', '.join(BATCHING_STRATEGIES)} (use inflight_fused_batching).")
    elif strategy != "inflight_fused_batching":
        report.add("warning", TRTLLM_MODEL, "gpt_model_type", f"gpt_model_type is {strategy}; in-flight fused "
                   "batching serves far more requests per second: use inflight_fused_batching.")
    fraction = params.get("kv_cache_free_gpu_mem_fraction")
    planned = expect.kv_cache_fraction
    try:
        value = float(fraction) if fraction is not None else None
    except ValueError:
        value = -1.0
    if value is not None and not 0 < value <= 1:
        report.add("error", TRTLLM_MODEL, "kv_cache", f"kv_cache_free_gpu_mem_fraction is {fraction!r}; it must "
                   "be a number in (0, 1].")
    elif value is not None and planned is not None and value != planned:
        report.add("error", TRTLLM_MODEL, "kv_cache", f"kv_cache_free_gpu_mem_fraction {fraction} differs from "
                   f"the build plan's kv_cache_fraction {planned}, which sized max_batch_size; set them equal.")
    path = model_dir or (Path(params["gpt_model_path"]) if params.get("gpt_model_path") else None)
    if path is None or not (path / "config.json").is_file():
        report.add("error", TRTLLM_MODEL, "gpt_model_path", f"gpt_model_path {str(path) if path else '(unset)'!r} "
                   "has no config.json; point it at the engine (or, for the cpu target, checkpoint) directory.")
        return None
    try:
        limits = read_limits(path, params)
    except (KitError, KeyError, ValueError) as exc:
        report.add("error", TRTLLM_MODEL, "gpt_model_path", f"{path}/config.json cannot be read as an engine or "
                   f"checkpoint config ({exc}); rebuild it.")
        return None
    _check_engine(trt, limits, report, expect)
    return limits


def _check_decoupled(configs: dict[str, mc.ModelConfig], report: ValidationReport) -> None:
    trt = configs.get(TRTLLM_MODEL)
    if trt is None:
        return
    decoupled = trt.model_transaction_policy.decoupled
    for name in ENTRY_MODELS:
        other = configs.get(name)
        if other is None or not other.HasField("model_transaction_policy"):
            continue
        if other.model_transaction_policy.decoupled != decoupled and (name == "tensorrt_llm_bls" or not decoupled):
            report.add("error", name, "decoupled", f"{name} has decoupled {other.model_transaction_policy.decoupled} "
                       f"but tensorrt_llm has decoupled {decoupled}; streaming needs both true: make them equal.")
    if not decoupled:
        report.add("warning", TRTLLM_MODEL, "decoupled", "tensorrt_llm is not decoupled, so requests with "
                   "stream=true are refused; set decoupled = true in [repo] to stream.")


def _load_tokenizer(path: Path) -> tuple[int | None, str | None]:
    """(vocabulary size, None) of the tokenizer the Python models load from ``path`` (``tokenizer.json`` with
    ``tokenizers``, else ``transformers`` with local files), or (None, why it cannot be loaded)."""
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size(), None
        except Exception as exc:  # tokenizers raises plain Exceptions for malformed files
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return None, f"its tokenizer.json cannot be read ({reason})"
    try:
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(str(path), local_files_only=True)), None
    except Exception as exc:  # transformers raises many kinds for files it cannot use
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"it has no tokenizer.json and transformers cannot load the files it has ({reason[:200]})"


def _check_python_models(repo: Path, configs: dict[str, mc.ModelConfig], report: ValidationReport,
                         limits: EngineLimits | None) -> None:
    for name in ("preprocessing", "postprocessing"):
        config = configs.get(name)
        if config is None:
            continue
        value = _params(config).get("tokenizer_dir")
        path = Path(value) if value else None
        if path is not None and not path.is_absolute():
            path = repo / name / path
        if path is None or not any((path / f).is_file() for f in TOKENIZER_CORE_FILES):
            report.add("error", name, "tokenizer", f"tokenizer_dir {value or '(unset)'!r} holds no tokenizer "
                       f"({', '.join(TOKENIZER_CORE_FILES)}); copy the model's tokenizer there or regenerate.")
            continue
        size, problem = _load_tokenizer(path)
        if problem:
            report.add("error", name, "tokenizer", f"tokenizer_dir {value!r}: {problem}; the model would fail to "
                       "load: copy the model's tokenizer files there or rebuild.")
            continue
        if limits is not None and limits.vocab_size and size and size > limits.vocab_size:
            report.add("error", name, "tokenizer", f"tokenizer_dir {value!r} has {size} tokens but the model's "
                       f"vocabulary has {limits.vocab_size} ({limits.model_dir}/config.json); the tokenizer belongs "
                       "to another model: copy the right one or regenerate.")
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        config = configs.get(name)
        if config is not None and sum(g.count or 1 for g in config.instance_group) == 1:
            report.add("warning", name, "instances", f"{name} has 1 instance, which serialises every request's "
                       "text work; use about 5 or the engine's max_batch_size.")


def validate_repository(repo: Path, *, read_limits: LimitsReader, model_dir: Path | None = None,
                        expect: Expectation | None = None) -> ValidationReport:
    """Check a Triton model repository; never raises for what it finds, only for a missing ``repo``.

    Arguments:
        repo: the repository directory; read_limits: reads the limits of the model directory
        ``gpt_model_path`` names (``trtllm_kit.targets.limits_from_dir``); model_dir: check against this
        engine/checkpoint directory instead of ``gpt_model_path`` (for a repository still being built);
        expect: what the artifact records (read from ``repo/../manifest.json`` when omitted).
    """
    if not repo.is_dir():
        raise KitUsageError(f"{repo} is not a directory; pass a model repository (a build's repo/ directory).")
    if expect is None:
        expect = Expectation.of_artifact(repo.parent)
    report = ValidationReport(repo)
    configs = _parse_files(repo, report)
    limits = None
    if TRTLLM_MODEL in configs:
        limits = _check_trtllm(configs[TRTLLM_MODEL], report, model_dir, expect, read_limits)
    _check_decoupled(configs, report)
    check_ensemble(repo, configs, report)
    check_draft_model(repo, configs, report, model_dir.parent if model_dir is not None else None)
    _check_python_models(repo, configs, report, limits)
    order = {name: i for i, name in enumerate(MODEL_NAMES)}
    report.findings.sort(key=lambda f: (f.severity != "error", order.get(f.model, 99)))
    return report


def print_report(report: ValidationReport) -> None:
    """A table of findings (or one line when there are none).

    Arguments:
        report: what ``validate_repository`` found.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not report.findings:
        console.print(f"{report.repo}: no findings; the repository is consistent.")
        return
    console.print(f"{report.repo}: {len(report.errors)} error(s), {len(report.findings) - len(report.errors)} "
                  "warning(s)", soft_wrap=True)  # one line however long the path, for grep
    table = Table()
    for column in ("severity", "model", "rule", "finding"):
        table.add_column(column, overflow="fold")
    for f in report.findings:
        table.add_row(f"[red]{f.severity}[/]" if f.severity == "error" else f"[yellow]{f.severity}[/]",
                      f.model, f.rule, f.message)
    console.print(table)
