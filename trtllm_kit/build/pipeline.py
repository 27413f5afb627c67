"""Runs the build stages in order into one atomically placed output directory.

Each stage is a function of the ``BuildContext``: it writes its own subdirectory of the staging
directory and its typed record to ``ctx.records``. ``spec.build.until`` names the last stage to run. The result is
an ``Artifact`` whose ``manifest.json`` every later command reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import Artifact, CacheRecord, ModelRecord
from trtllm_kit.artifact.archive import pack_archive
from trtllm_kit.artifact.files import file_hashes, sha256_file, tool_versions
from trtllm_kit.artifact.integrity import file_stats
from trtllm_kit.artifact.machine import detect_machine
from trtllm_kit.build.cache import BackgroundDigests, Previous, fingerprint, input_digests, stage_key
from trtllm_kit.build.compile_stage import compile_stage, prepare_compile
from trtllm_kit.build.repo_stage import repo_key_parts, repo_stage
from trtllm_kit.build.staging import check_out_dir, reclaim_stale, staged_dir
from trtllm_kit.checkpoint.convert import work_items
from trtllm_kit.checkpoint.quality import choices_path, heldout_path
from trtllm_kit.checkpoint.trtllm_config import precision_of, resolve_dtype
from trtllm_kit.llmapi.draft_copy import draft_fingerprints
from trtllm_kit.lora.store import add_adapter
from trtllm_kit.mapping import Mapping, check_tp
from trtllm_kit.models.inspect import ModelSpec, inspect_model
from trtllm_kit.progress import Reporter
from trtllm_kit.quant.algos import check_model
from trtllm_kit.quant.calib_size import calibration_device, choose_size
from trtllm_kit.spec import STAGES, BuildSpec
from trtllm_kit.spec.draft_tokenizer import check_draft
from trtllm_kit.spec.heads_reader import HEADS_MODES
from trtllm_kit.targets.base import BuildContext, EngineSetup
from trtllm_kit.targets.checkpoint_stage import should_verify


@dataclass(frozen=True)
class BuildResult:
    """What a build produced: the manifest and a summary for ``--json``."""

    artifact: Artifact
    summary: dict[str, Any]

    @property
    def out_dir(self) -> Path:
        return self.artifact.path

    @property
    def manifest_path(self) -> Path:
        return self.artifact.manifest_path


def checkpoint_stage(ctx: BuildContext) -> None:
    """HF weights → the target's ``checkpoint/`` (+ ``tokenizer/``)."""
    assert ctx.engine is not None, "run_build prepares the engine stage"
    ctx.engine.target.write_checkpoint(ctx)


STAGE_FUNCTIONS: dict[str, Callable[[BuildContext], None]] = {"checkpoint": checkpoint_stage, "engine": compile_stage,
                                                              "repo": repo_stage}
# [build] fields that do not change the checkpoint (the others and every [quant] field are in its key)
NOT_CHECKPOINT_FIELDS = ("until", "target", "force", "archive", "gpu", "gpu_memory", "kv_cache_fraction",
                         "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block",
                         "build_flags", "verify", "max_lora_rank", "max_loras", "lora_target_modules",
                         "lora")
CHECKPOINT_TOOLS = ("trtllm_kit", "torch", "transformers", "safetensors")


def verify_texts() -> dict[str, str]:
    """The sha256 of the texts the verify step measures on: a changed text makes a cached checkpoint's figures stale."""
    return {path.name: sha256_file(path) for path in (heldout_path(), choices_path())}


def stage_keys(spec: BuildSpec, model: ModelSpec, digests: dict[str, str], engine: EngineSetup) -> dict[str, str]:
    """The cache key of every stage: its inputs, the spec fields it reads, the tool versions, the previous key."""
    tools = tool_versions()
    values = spec.to_dict()
    fields = {**{k: v for k, v in values["build"].items() if k not in NOT_CHECKPOINT_FIELDS}, **values["quant"]}
    if spec.quant_config().needs_calibration:  # the size the device gives when the spec leaves it out
        size = choose_size(spec.quant_config(), calibration_device())
        fields.update(calib_samples=size.samples, calib_seq_len=size.seq_len)
    verify = should_verify(spec, model)
    parts = {"inputs": digests, "spec": fields, "verify": verify, "verify_texts": verify_texts() if verify else None,
             "tools": {k: tools.get(k) for k in CHECKPOINT_TOOLS}}
    if spec.speculative.draft_model is not None:  # converted (engine) or copied (llmapi) with the checkpoint
        parts["draft"] = draft_fingerprints(spec.speculative.draft_model)
    if spec.speculative.mode in HEADS_MODES:  # the heads and their tree's size are in the checkpoint
        parts["heads"] = {"mode": str(spec.speculative.mode), "tree": spec.speculative.tree}
    checkpoint = stage_key("checkpoint", parts)
    engine_key = stage_key("engine", {"checkpoint": checkpoint, **engine.key_parts()})
    return {"checkpoint": checkpoint, "engine": engine_key,
            "repo": stage_key("repo", {"engine": engine_key, **repo_key_parts(spec)})}


def run_build(spec: BuildSpec, reporter: Reporter | None = None, early: BackgroundDigests | None = None,
              ) -> BuildResult:
    """Run the stages up to ``spec.build.until`` into ``spec.out``; nothing is left behind on failure.

    Arguments:
        spec: the validated build spec.
        reporter: progress and notes (silent when omitted).
        early: the inputs' digests begun before the libraries loaded (``commands/build.py``), taken where the
        files have not changed since.
    """
    reporter = reporter or Reporter()
    started = time.perf_counter()
    check_out_dir(spec.out, force=spec.build.force)
    model = inspect_model(spec.model, allow_pickle=spec.build.allow_pickle)
    mapping = Mapping(spec.build.tp, spec.build.pp)
    check_tp(model.hf.num_attention_heads, model.hf.num_key_value_heads, model.hf.intermediate_size, spec.build.tp)
    check_model(spec.quant_config(), model.hf, spec.build.tp)
    check_draft(spec.speculative, model.path)
    work_items(model, mapping)  # refuses pp larger than the layer count before any work
    if model.origin is not None:
        reporter.note(f"{model.origin.name}: imported from GGUF into {model.path} (the file's sha256 is among the "
                      "manifest's inputs)")
    reporter.note(f"{model.source}: {model.family.name} ({model.hf.architecture}), "
                  f"{model.hf.num_parameters / 1e6:.1f}M parameters, tp={spec.build.tp} pp={spec.build.pp}")
    stages = STAGES[: STAGES.index(spec.build.until) + 1]
    engine = prepare_compile(spec, model.hf, model.family, detect_machine(), compile_requested="engine" in stages)
    if "engine" in stages:
        reporter.note(engine.reason)
    input_paths = [*([model.origin] if model.origin else []), model.path / "config.json", *model.weight_files]
    if spec.quant.calib_data is not None and Path(spec.quant.calib_data).is_file():
        input_paths.append(Path(spec.quant.calib_data))  # the calibration text decides the scales: key on it
    previous = Previous.load(spec.out, force=spec.build.force)
    digests = input_digests(input_paths, previous, known=early.result() if early is not None else None)
    keys = stage_keys(spec, model, digests, engine)
    reused = []
    for path, size in reclaim_stale(spec.out):
        reporter.note(f"removed {path.name} ({size / 1e6:.1f} MB), left by a build that was killed")
    needed = 0 if previous.can_reuse("checkpoint", keys["checkpoint"]) else expected_bytes(spec, model)
    with staged_dir(spec.out, force=spec.build.force, needed_bytes=needed) as stage_dir:
        ctx = BuildContext(spec, model, mapping, reporter, stage_dir, engine=engine, inputs=digests)
        ctx.records.lora = engine.lora
        ctx.records.model = ModelRecord(source=model.source, path=str(model.path), family=model.family.name,
                                        architecture=model.hf.architecture, num_parameters=model.hf.num_parameters)
        for name in stages:
            t0 = time.perf_counter()
            if previous.can_reuse(name, keys[name]):
                previous.reuse(name, stage_dir, ctx.records)
                reused.append(name)
                reporter.note(f"{name}: unchanged (cache key {keys[name]}), reused")
            else:
                if previous.key(name) == keys[name]:
                    reporter.note(f"{name}: {previous.damage(name)}; building it again")
                STAGE_FUNCTIONS[name](ctx)
            ctx.timings[name] = time.perf_counter() - t0
        ctx.timings["total"] = time.perf_counter() - started
        ctx.records.stages = list(stages)
        artifact = Artifact(
            path=stage_dir, spec=spec, target=_served_target(ctx), layout=mapping,
            precision=precision_of(spec, model.hf), records=ctx.records, inputs=digests, tools=tool_versions(),
            machine=engine.machine.to_dict(),
            cache=CacheRecord(stages={name: keys[name] for name in stages}, reused=reused,
                              fingerprints={p.name: fingerprint(p) for p in input_paths}),
            timings_s={k: round(v, 3) for k, v in ctx.timings.items()},
            files=file_hashes(stage_dir, previous.outputs_of(reused)), file_stats=file_stats(stage_dir))
        artifact.write()
        for name, source in spec.build.lora.items():  # inside the staging dir: the build and its adapters land at once
            add_adapter(stage_dir, name, Path(source))
        if spec.build.lora:
            artifact = Artifact.read(stage_dir)
    artifact = artifact.moved(spec.out.absolute())
    summary = {"manifest": str(artifact.manifest_path), **artifact.records.to_dict(), "reused": reused}
    if spec.build.archive:
        summary["archive"] = str(pack_archive(artifact.path, spec.build.archive).absolute())
    return BuildResult(artifact, summary)


def _served_target(ctx: BuildContext) -> str:
    """The target the artifact serves on: the repository's (or, before a repo stage, the compile stage's)."""
    if ctx.records.repo is not None:
        return ctx.records.repo.target
    return ctx.records.engine.target if ctx.records.engine is not None else "cpu"


def expected_bytes(spec: BuildSpec, model: ModelSpec) -> int:
    """About what a build writes: the weights in the checkpoint's precision, the tokenizer three times (its own
    directory and two text models of the repository) and 1 MB of configs and model files.

    Arguments:
        spec: the build spec; model: the inspected model.
    """
    dtype = resolve_dtype(spec.build.dtype, model.hf)
    element = 1 if spec.quant_config().quant in ("fp8", "int8-sq") else {"float32": 4}.get(dtype, 2)
    tokenizer = sum(p.stat().st_size for p in model.tokenizer_files)
    return model.hf.num_parameters * element + 3 * tokenizer + 1_000_000
