"""The artifacts one serve brings up: their served names, their models in the working repository, their routes.

One artifact keeps the repository's model names as built. Several get the prefix ``NAME__`` (``NAME`` the served
name with characters Triton does not take in a model name replaced), and a reload brings a new version in as
``NAME__vN__``. A served name defaults to the artifact's model source, made unique with ``-2``, ``-3``, ...;
``--name NAME=OUT`` sets it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.artifact import Artifact
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.fleet.merge import TRTLLM_MODEL, Copied, copy_models, slug
from trtllm_kit.serve.openai.bls_route import bls_num_draft_tokens
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.repository_limits import max_batch_size, max_seq_len
from trtllm_kit.serve.servable import Servable
from trtllm_kit.targets import get_target


@dataclass(frozen=True)
class Member:
    """One served artifact: its name, its servable output, and the prefix of its Triton models."""

    name: str
    target: Servable
    prefix: str
    version: int = 1


def plan_members(targets: list[Servable], names: dict[str, Path]) -> list[Member]:
    """Name each artifact (``names`` first, else its model source made unique) and give it its model prefix.

    Arguments:
        targets: the artifacts in command-line order; names: ``--name`` as served name → output directory.
    """
    by_out = {os.path.realpath(out): name for name, out in names.items()}
    taken = set(names)
    members = []
    for target in targets:
        name = by_out.get(os.path.realpath(target.out))
        if name is None:
            base = name = target.artifact.model_source
            number = 1
            while name in taken:
                number += 1
                name = f"{base}-{number}"
        taken.add(name)
        members.append(Member(name, target, ""))
    if len(members) == 1:
        return members
    prefixes: set[str] = set()
    prefixed = []
    for member in members:
        prefix = slug(member.name)
        number = 1
        while f"{prefix}__" in prefixes:
            number += 1
            prefix = f"{slug(member.name)}_{number}"
        prefixes.add(f"{prefix}__")
        prefixed.append(Member(member.name, member.target, f"{prefix}__"))
    return prefixed


def versioned(name: str, target: Servable, version: int) -> Member:
    """The member a reload brings in: ``target`` as version ``version`` of the served name ``name``.

    Arguments:
        name: the served name; target: the new artifact; version: 2 or more.
    """
    return Member(name, target, f"{slug(name)}__v{version}__", version)


def working_repository(members: list[Member], directory: Path) -> tuple[Path, list[Copied]]:
    """A fresh model repository in ``directory`` (the serve's run directory) holding every member's models.

    Arguments:
        members: from ``plan_members``; directory: from ``claim_run_dir``.
    """
    repo = directory / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    shared: dict[str, str] | None = {} if len(members) > 1 else None
    copies = [copy_models(member.target.repo, repo, member.prefix, shared) for member in members]
    return repo.absolute(), copies


def route(member: Member, copied: Copied, text_model: str) -> Route:
    """The frontend's route to ``member``.

    Arguments:
        member: the served artifact; copied: its models in the working repository; text_model: the model as
        built that text requests go to (``tensorrt_llm_bls``, ``ensemble``, or the llmapi ``tensorrt_llm``).
    """
    if text_model == "tensorrt_llm_bls" and text_model not in copied.names:
        text_model = "ensemble"  # a BLS that cannot be renamed is left out of a merged repository
    if text_model not in copied.names:
        raise KitUsageError(f"{member.target.repo} has no {text_model} model; it has {', '.join(copied.names)}.")
    token_model = copied.names.get(TRTLLM_MODEL, TRTLLM_MODEL)
    artifact = member.target.artifact
    return Route(member.name, copied.name(text_model), token_model, member.target.tokenizer_dir,
                 max_seq_len(member.target.repo), member.version, tuple(copied.ordered()), member.target.out,
                 context_logits=context_logits(artifact), max_batch_size=max_batch_size(member.target.repo),
                 num_draft_tokens=bls_num_draft_tokens(artifact.target, artifact.spec.speculative))


def context_logits(artifact: Artifact) -> bool | None:
    """For a C++ backend (no prompt-logprob output): whether its engine gathers context logits, from which prompt
    logprobs are computed (``[build] context_logits``, recorded in the build command); None for a Python model,
    which scores prompts itself.

    Arguments:
        artifact: the served artifact.
    """
    if get_target(artifact.target).slot_model is not None:
        return None
    engine = artifact.records.engine
    return engine is not None and engine.context_logits
