"""What a serve whose model runs in the kit's own processes checks and claims before it starts anything
(``serve --dynamo``'s workers and ``serve --ray``'s replicas run the CPU ``LLM``): the artifact's target and files,
that nobody serves it already, the OpenAI port, the run directory; and the name the model is served under."""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.integrity import check_artifact
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.options import ServeOptions, parse_names
from trtllm_kit.serve.server.launcher import check_ports_free
from trtllm_kit.serve.server.state import claim_run_dir, serving_pid

TARGETS = ("cpu", "llmapi")  # what the CPU LLM runs
LOOPBACK = "127.0.0.1"


def claim_artifact(options: ServeOptions, flag: str, runs: str) -> tuple[Artifact, Path]:
    """OUT's artifact, checked, and its run directory, claimed by this process.

    Arguments:
        options: the serve; flag: the serve's mode (``--dynamo``); runs: what that mode runs, for the refusal.
    """
    settings, out = options.settings, options.out
    artifact = Artifact.read(out)
    if artifact.target not in TARGETS:
        raise KitUsageError(f"{out} is a {artifact.target} artifact; {flag} runs {runs} on cpu and llmapi "
                            "artifacts (build with --target cpu or --target llmapi).")
    check_artifact(artifact, hashes=settings.verify)
    holder = serving_pid(out)
    if holder is not None:
        raise KitUsageError(f"{out} is already served by pid {holder}; run trtllm-kit stop {out}.")
    assert settings.openai_port is not None
    check_ports_free(LOOPBACK, {"OpenAI": settings.openai_port})
    return artifact, claim_run_dir(out)


def served_name(options: ServeOptions, artifact: Artifact) -> str:
    """The model's name on the frontend: its ``--name``, else its model source.

    Arguments:
        options: the serve; artifact: OUT's artifact.
    """
    names = [name for name, out in parse_names(options.names).items()
             if out.resolve() == options.out.resolve()]
    return names[0] if names else artifact.model_source
