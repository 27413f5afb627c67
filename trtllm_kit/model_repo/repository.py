"""Write a Triton model repository: five model directories, their ``config.pbtxt``, the kit's ``model.py``
files and the tokenizer; and the build stage that does it."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from trtllm_kit.artifact import EngineLimits, RepoRecord
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.configs import (
    SCHEMA,
    parse_config,
    repository_configs,
    set_guided_decoding,
    set_parameters,
    to_text,
)
from trtllm_kit.model_repo.lora import LoraServing, set_lora
from trtllm_kit.model_repo.options import resolve_options
from trtllm_kit.model_repo.spec_decode import DraftServing, speculate_through_bls
from trtllm_kit.model_repo.xgrammar_info import FILE_NAME as TOKENIZER_INFO
from trtllm_kit.model_repo.xgrammar_info import write_xgrammar_tokenizer_info
from trtllm_kit.names import DRAFT_MODEL, TOKENIZER_CORE_FILES, TOKENIZER_DIR, TRTLLM_MODEL
from trtllm_kit.spec.repo_options import RepoOptions

# model → (source file in trtllm_kit/triton_models, helper files shipped next to it)
PYTHON_MODELS = {
    "preprocessing": ("preprocessing.py", ("text_codec.py",)),
    "postprocessing": ("postprocessing.py", ("text_codec.py",)),
    "tensorrt_llm_bls": ("tensorrt_llm_bls.py", ()),
}


def python_source(name: str) -> Path:
    """A file of the kit's shipped Python models.

    Arguments:
        name: its file name in ``trtllm_kit/triton_models``.
    """
    return Path(str(resources.files("trtllm_kit.triton_models") / name))


def write_repository(repo_dir: Path, limits: EngineLimits, options: RepoOptions, *, model_path: Path,
                     tokenizer_files: list[Path], plan_fraction: float | None = None,
                     final_dir: Path | None = None, lora: LoraServing | None = None,
                     decoding: dict[str, str] | None = None, draft: DraftServing | None = None) -> RepoRecord:
    """Write the repository into the empty or missing ``repo_dir``; returns its record for the manifest. With a
    fast tokenizer (``tokenizer.json``), ``tensorrt_llm/xgrammar_tokenizer_info.json`` is written and guided
    decoding with xgrammar is turned on.

    Arguments:
        repo_dir: where to write; limits: what the engine (or the CPU runtime) runs;
        options: the user's repository settings (``None`` fields are derived);
        model_path: ``gpt_model_path`` as the server will see it (the engine or checkpoint directory);
        tokenizer_files: the HF tokenizer files to copy; plan_fraction: the plan's KV-cache fraction;
        final_dir: where the repository will be served from (absolute paths in parameters point there;
        None: ``repo_dir``); lora: the LoRA inputs and cache of a model that takes adapters (None: it takes none);
        decoding: the ``tensorrt_llm`` model's speculative decoding parameters (``decoding_mode: lookahead`` and
        its sizes), or none; draft: the draft engine of draft-target speculation (``tensorrt_llm_draft``, served
        through the BLS), or none.
    """
    resolved = resolve_options(options, limits, plan_fraction)
    configs = repository_configs(limits, resolved, model_path, Path(TOKENIZER_DIR))
    has_text = has_tokenizer(tokenizer_files)
    if not has_text:  # token ids in and out only: the models that tokenize, and the entry points, need a tokenizer
        configs = {TRTLLM_MODEL: configs[TRTLLM_MODEL]}
    if lora is not None:
        set_lora(configs, lora, resolved)
    if decoding:
        set_parameters(configs[TRTLLM_MODEL], decoding)
    if draft is not None:
        if not has_text:
            raise KitUsageError("--speculative draft-target needs the model's tokenizer (the BLS that runs the draft "
                                "takes text), and none was found; add tokenizer files to the model.")
        speculate_through_bls(configs, draft, resolved)
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
    slot_model = limits.slot_model
    if slot_model is not None:  # the kit's Python model serves the tensorrt_llm slot (and the draft's)
        sources[TRTLLM_MODEL] = (slot_model, ())
        if draft is not None:
            sources[DRAFT_MODEL] = (slot_model, ())
    for name, (source, helpers) in sources.items():
        shutil.copy2(python_source(source), repo_dir / name / "1" / "model.py")
        for helper in helpers:
            shutil.copy2(python_source(helper), repo_dir / name / "1" / helper)
    for name in ("preprocessing", "postprocessing") if has_text else ():
        (repo_dir / name / TOKENIZER_DIR).mkdir()
        for path in tokenizer_files:
            shutil.copy2(path, repo_dir / name / TOKENIZER_DIR / path.name)
    return RepoRecord(dir=repo_dir.name, schema=SCHEMA, target=limits.target, models=list(configs), text=has_text,
                      gpt_model_path=str(model_path), limits=limits, options=resolved)


def has_tokenizer(files: list[Path]) -> bool:
    """Whether ``files`` include a tokenizer (not only, say, ``generation_config.json``).

    Arguments:
        files: the model's tokenizer-related files.
    """
    return any(path.name in TOKENIZER_CORE_FILES for path in files)
