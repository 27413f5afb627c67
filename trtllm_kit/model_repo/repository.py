"""Write a Triton model repository: five model directories, their ``config.pbtxt``, the kit's ``model.py``
files and the tokenizer; and the build stage that does it."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.build.artifact import sha256_file
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.model_repo.configs import SCHEMA, TRTLLM_MODEL, parse_config, repository_configs, to_text
from trtllm_kit.model_repo.limits import EngineLimits, cpu_limits, engine_limits
from trtllm_kit.model_repo.options import REPO_FIELDS, RepoOptions, plan_of
from trtllm_kit.model_repo.validate import TOKENIZER_FILES, validate_repository

if TYPE_CHECKING:
    from trtllm_kit.build.pipeline import BuildContext

TOKENIZER_DIR = "tokenizer"  # inside each model directory that tokenizes; relative paths resolve there
# model → (source file in trtllm_kit/model_repo/python, helper files shipped next to it)
PYTHON_MODELS = {
    "preprocessing": ("preprocessing.py", ("text_codec.py",)),
    "postprocessing": ("postprocessing.py", ("text_codec.py",)),
    "tensorrt_llm_bls": ("tensorrt_llm_bls.py", ()),
}
CPU_RUNTIME_MODEL = "tensorrt_llm_cpu.py"


def python_source(name: str) -> Path:
    """A file of the kit's shipped Python models.

    Arguments:
        name: its file name in ``trtllm_kit/model_repo/python``.
    """
    return Path(str(resources.files("trtllm_kit.model_repo") / "python" / name))


def write_repository(repo_dir: Path, limits: EngineLimits, options: RepoOptions, *, model_path: Path,
                     tokenizer_files: list[Path], plan_fraction: float | None = None) -> dict[str, Any]:
    """Write the repository into the empty or missing ``repo_dir``; returns a summary for the manifest.

    Arguments:
        repo_dir: where to write; limits: what the engine (or the CPU runtime) runs;
        options: the user's repository settings (``None`` fields are derived);
        model_path: ``gpt_model_path`` as the server will see it (the engine or checkpoint directory);
        tokenizer_files: the HF tokenizer files to copy; plan_fraction: the plan's KV-cache fraction.
    """
    resolved = options.resolve(limits, plan_fraction)
    configs = repository_configs(limits, resolved, model_path, Path(TOKENIZER_DIR))
    has_text = has_tokenizer(tokenizer_files)
    if not has_text:  # token ids in and out only: the models that tokenize, and the entry points, need a tokenizer
        configs = {TRTLLM_MODEL: configs[TRTLLM_MODEL]}
    repo_dir.mkdir(parents=True, exist_ok=True)
    for name, config in configs.items():
        text = to_text(config)
        if "${" in text or parse_config(text) != config:  # internal invariant of the generator
            raise AssertionError(f"{name}/config.pbtxt does not round-trip through text_format")
        model_dir = repo_dir / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(text)
    sources = dict(PYTHON_MODELS) if has_text else {}
    if limits.target == "cpu":
        sources[TRTLLM_MODEL] = (CPU_RUNTIME_MODEL, ())
    for name, (source, helpers) in sources.items():
        shutil.copy2(python_source(source), repo_dir / name / "1" / "model.py")
        for helper in helpers:
            shutil.copy2(python_source(helper), repo_dir / name / "1" / helper)
    for name in ("preprocessing", "postprocessing") if has_text else ():
        (repo_dir / name / TOKENIZER_DIR).mkdir()
        for path in tokenizer_files:
            shutil.copy2(path, repo_dir / name / TOKENIZER_DIR / path.name)
    return {"dir": repo_dir.name, "schema": SCHEMA, "target": limits.target, "models": list(configs), "text": has_text,
            "gpt_model_path": str(model_path), "limits": limits.to_dict(), "options": resolved.to_dict()}


def has_tokenizer(files: list[Path]) -> bool:
    """Whether ``files`` include a tokenizer (not only, say, ``generation_config.json``).

    Arguments:
        files: the model's tokenizer-related files.
    """
    return any(path.name in TOKENIZER_FILES for path in files)


def _target(ctx: BuildContext) -> str:
    """``engine`` when an engine was built (or demanded), else ``cpu``."""
    decided = (ctx.summary.get("engine") or {}).get("target")
    if decided in ("engine", "cpu"):
        return decided
    has_engine = (ctx.out / "engines" / "config.json").is_file()
    if ctx.spec.build.target == "engine" and not has_engine:
        raise KitUsageError("target engine needs engines/ from the engine stage, but none was built; run with "
                            "--until repo on a GPU machine or pass --target cpu.")
    return "engine" if ctx.spec.build.target == "engine" or (ctx.spec.build.target == "auto" and has_engine) else "cpu"


def _plan_fraction(ctx: BuildContext) -> float | None:
    plan = plan_of(ctx.summary)
    if "kv_cache_fraction" in plan:
        return float(plan["kv_cache_fraction"])
    return ctx.spec.build.kv_cache_fraction


def repo_key_parts(spec: Any) -> dict[str, Any]:
    """What decides the repository besides the engine: the [repo] options, the CPU runtime's limits, the output
    location (``gpt_model_path`` is absolute) and the shipped Python models.

    Arguments:
        spec: the build spec.
    """
    values = spec.to_dict()
    sources = sorted({f for source, helpers in PYTHON_MODELS.values() for f in (source, *helpers)}
                     | {CPU_RUNTIME_MODEL})
    return {"options": {k: values["repo"][k] for k in REPO_FIELDS},
            "limits": {k: values["build"][k] for k in ("max_batch_size", "max_num_tokens", "max_seq_len",
                                                        "tokens_per_block", "kv_cache_fraction")},
            "target": values["build"]["target"], "out": str(Path(values["out"]).absolute()), "schema": SCHEMA,
            "sources": {name: sha256_file(python_source(name)) for name in sources}}


def repo_stage(ctx: BuildContext) -> None:
    """Engine or checkpoint → ``repo/``, validated in place before the build output is moved into position."""
    target = _target(ctx)
    final_out = ctx.spec.out.absolute()
    if target == "engine":
        limits = engine_limits(ctx.out / "engines")
        model_path = final_out / "engines"
    else:
        spec_values = ctx.spec.to_dict()["build"]
        limits = cpu_limits(ctx.out / "checkpoint", **{k: spec_values.get(k) for k in (
            "max_batch_size", "max_num_tokens", "max_seq_len", "tokens_per_block")})
        model_path = final_out / "checkpoint"
    tokenizer_dir = ctx.out / "tokenizer"
    files = sorted(tokenizer_dir.iterdir()) if tokenizer_dir.is_dir() else list(ctx.model.tokenizer_files)
    options = ctx.spec.repo
    summary = write_repository(ctx.out / "repo", limits, options, model_path=model_path, tokenizer_files=files,
                               plan_fraction=_plan_fraction(ctx))
    report = validate_repository(ctx.out / "repo", model_dir=limits.model_dir, manifest_summary=ctx.summary)
    if report.errors:
        first = report.errors[0]
        raise KitError(f"the generated repository fails validation: {first.model}: {first.message}")
    ctx.summary["repo"] = summary
    if not summary["text"]:
        ctx.reporter.note(f"repo: {ctx.model.source} has no tokenizer, so only tensorrt_llm (token ids in and out) "
                          "was written; add tokenizer files to the model for text in and out")
    ctx.reporter.note(f"repo: {target} target, max_batch_size {limits.max_batch_size}, decoupled "
                      f"{summary['options']['decoupled']}, {len(report.findings)} validation note(s)")
