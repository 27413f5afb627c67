"""Write a Triton model repository: five model directories, their ``config.pbtxt``, the kit's ``model.py``
files and the tokenizer; and the build stage that does it."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.artifact import RepoRecord
from trtllm_kit.build.artifact import sha256_file
from trtllm_kit.errors import KitError
from trtllm_kit.model_repo.configs import (
    SCHEMA,
    TRTLLM_MODEL,
    parse_config,
    repository_configs,
    set_guided_decoding,
    to_text,
)
from trtllm_kit.model_repo.limits import EngineLimits
from trtllm_kit.model_repo.options import REPO_FIELDS, RepoOptions
from trtllm_kit.model_repo.validate import TOKENIZER_FILES, Expectation, validate_repository
from trtllm_kit.model_repo.xgrammar_info import FILE_NAME as TOKENIZER_INFO
from trtllm_kit.model_repo.xgrammar_info import write_xgrammar_tokenizer_info
from trtllm_kit.targets import get_target

if TYPE_CHECKING:
    from trtllm_kit.build.pipeline import BuildContext

TOKENIZER_DIR = "tokenizer"  # inside each model directory that tokenizes; relative paths resolve there
# model → (source file in trtllm_kit/model_repo/python, helper files shipped next to it)
PYTHON_MODELS = {
    "preprocessing": ("preprocessing.py", ("text_codec.py",)),
    "postprocessing": ("postprocessing.py", ("text_codec.py",)),
    "tensorrt_llm_bls": ("tensorrt_llm_bls.py", ()),
}


def python_source(name: str) -> Path:
    """A file of the kit's shipped Python models.

    Arguments:
        name: its file name in ``trtllm_kit/model_repo/python``.
    """
    return Path(str(resources.files("trtllm_kit.model_repo") / "python" / name))


def write_repository(repo_dir: Path, limits: EngineLimits, options: RepoOptions, *, model_path: Path,
                     tokenizer_files: list[Path], plan_fraction: float | None = None,
                     final_dir: Path | None = None) -> RepoRecord:
    """Write the repository into the empty or missing ``repo_dir``; returns its record for the manifest. With a
    fast tokenizer (``tokenizer.json``), ``tensorrt_llm/xgrammar_tokenizer_info.json`` is written and guided
    decoding with xgrammar is turned on.

    Arguments:
        repo_dir: where to write; limits: what the engine (or the CPU runtime) runs;
        options: the user's repository settings (``None`` fields are derived);
        model_path: ``gpt_model_path`` as the server will see it (the engine or checkpoint directory);
        tokenizer_files: the HF tokenizer files to copy; plan_fraction: the plan's KV-cache fraction;
        final_dir: where the repository will be served from (absolute paths in parameters point there;
        None: ``repo_dir``).
    """
    resolved = options.resolve(limits, plan_fraction)
    configs = repository_configs(limits, resolved, model_path, Path(TOKENIZER_DIR))
    has_text = has_tokenizer(tokenizer_files)
    if not has_text:  # token ids in and out only: the models that tokenize, and the entry points, need a tokenizer
        configs = {TRTLLM_MODEL: configs[TRTLLM_MODEL]}
    fast_tokenizer = next((path for path in tokenizer_files if path.name == "tokenizer.json"), None)
    if fast_tokenizer is not None:
        set_guided_decoding(configs[TRTLLM_MODEL], str((final_dir or repo_dir).absolute() / TRTLLM_MODEL
                                                       / TOKENIZER_INFO))
    repo_dir.mkdir(parents=True, exist_ok=True)
    for name, config in configs.items():
        text = to_text(config)
        if "${" in text or parse_config(text) != config:  # internal invariant of the generator
            raise AssertionError(f"{name}/config.pbtxt does not round-trip through text_format")
        model_dir = repo_dir / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(text)
    if fast_tokenizer is not None:
        write_xgrammar_tokenizer_info(fast_tokenizer.parent, repo_dir / TRTLLM_MODEL / TOKENIZER_INFO)
    sources = dict(PYTHON_MODELS) if has_text else {}
    slot_model = get_target(limits.target).slot_model
    if slot_model is not None:  # the kit's Python model serves the tensorrt_llm slot
        sources[TRTLLM_MODEL] = (slot_model, ())
    for name, (source, helpers) in sources.items():
        shutil.copy2(python_source(source), repo_dir / name / "1" / "model.py")
        for helper in helpers:
            shutil.copy2(python_source(helper), repo_dir / name / "1" / helper)
    for name in ("preprocessing", "postprocessing") if has_text else ():
        (repo_dir / name / TOKENIZER_DIR).mkdir()
        for path in tokenizer_files:
            shutil.copy2(path, repo_dir / name / TOKENIZER_DIR / path.name)
    return RepoRecord(dir=repo_dir.name, schema=SCHEMA, target=limits.target, models=list(configs), text=has_text,
                      gpt_model_path=str(model_path), limits=limits.to_dict(), options=resolved.to_dict())


def has_tokenizer(files: list[Path]) -> bool:
    """Whether ``files`` include a tokenizer (not only, say, ``generation_config.json``).

    Arguments:
        files: the model's tokenizer-related files.
    """
    return any(path.name in TOKENIZER_FILES for path in files)


def repo_key_parts(spec: Any) -> dict[str, Any]:
    """What decides the repository besides the engine: the [repo] options, the CPU runtime's limits, the output
    location (``gpt_model_path`` is absolute) and the shipped Python models.

    Arguments:
        spec: the build spec.
    """
    from trtllm_kit.targets import TARGETS

    values = spec.to_dict()
    sources = sorted({f for source, helpers in PYTHON_MODELS.values() for f in (source, *helpers)}
                     | {t.slot_model for t in TARGETS.values() if t.slot_model})
    return {"options": {k: values["repo"][k] for k in REPO_FIELDS},
            "limits": {k: values["build"][k] for k in ("max_batch_size", "max_num_tokens", "max_seq_len",
                                                        "tokens_per_block", "kv_cache_fraction")},
            "target": values["build"]["target"], "out": str(Path(values["out"]).absolute()), "schema": SCHEMA,
            "sources": {name: sha256_file(python_source(name)) for name in sources}}


def repo_stage(ctx: BuildContext) -> None:
    """Engine or checkpoint → ``repo/``, validated in place before the build output is moved into position."""
    engine = ctx.records.engine
    assert engine is not None, "the engine stage runs (or is reused) before the repo stage"
    target = get_target(engine.target)
    own = target.write_repo(ctx)  # a target with its own repository layout (llmapi)
    if own is not None:
        ctx.records.repo = own
        return
    build = ctx.spec.build
    limits = target.limits(ctx.out / target.model_dir, {
        "max_batch_size": build.max_batch_size, "max_num_tokens": build.max_num_tokens,
        "max_seq_len": build.max_seq_len, "tokens_per_block": build.tokens_per_block})
    tokenizer_dir = ctx.out / "tokenizer"
    files = sorted(tokenizer_dir.iterdir()) if tokenizer_dir.is_dir() else list(ctx.model.tokenizer_files)
    fraction = engine.kv_cache_fraction
    record = write_repository(ctx.out / "repo", limits, ctx.spec.repo,
                              model_path=ctx.spec.out.absolute() / target.model_dir, tokenizer_files=files,
                              plan_fraction=fraction if fraction is not None else build.kv_cache_fraction,
                              final_dir=ctx.spec.out.absolute() / "repo")
    expect = Expectation(world_size=ctx.mapping.world_size, kv_cache_fraction=fraction)
    report = validate_repository(ctx.out / "repo", model_dir=limits.model_dir, expect=expect)
    if report.errors:
        first = report.errors[0]
        raise KitError(f"the generated repository fails validation: {first.model}: {first.message}")
    ctx.records.repo = record
    if not record.text:
        ctx.reporter.note(f"repo: {ctx.model.source} has no tokenizer, so only tensorrt_llm (token ids in and out) "
                          "was written; add tokenizer files to the model for text in and out")
    ctx.reporter.note(f"repo: {target.name} target, max_batch_size {limits.max_batch_size}, decoupled "
                      f"{record.options['decoupled']}, {len(report.findings)} validation note(s)")
