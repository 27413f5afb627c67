"""guidellm and aiperf, the benchmark clients, against a served model: requests sent, completed and errored.

    python benchmarks/eval_clients.py [--base-url URL] [--requests 24] [--install-only] [--json]

Each client runs from its own virtual environment in the user's cache (``~/.cache/trtllm-kit/eval-clients/CLIENT``
on Linux, whatever ``TRTLLM_KIT_CACHE`` says), created with ``pip`` on first use: both pull in packages that
cannot share the kit's environment (guidellm needs numpy 2; nvidia-pytriton needs numpy < 2). Without
``--base-url`` the built-in ``tiny-llama`` is built for the cpu target and served on free loopback ports. Both
clients get the model's Hugging Face directory as their tokenizer and synthetic prompts (``--requests`` of 64
tokens asking for 16, ``ignore_eos``), so nothing is downloaded. guidellm runs with its defaults otherwise, its
backend validation (``GET /health``) included; aiperf streams chat completions two at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import platformdirs  # noqa: E402
from served import served_build  # noqa: E402

from trtllm_kit.models.builtin import builtin_dir  # noqa: E402

CLIENTS = {"guidellm": "guidellm==0.8.1", "aiperf": "aiperf==0.13.0"}
MODEL = "builtin:tiny-llama"
PROMPT_TOKENS, OUTPUT_TOKENS = 64, 16


@dataclass
class ClientFigures:
    client: str
    num_requests: int  # what the run was asked for
    num_completed: int
    num_errors: int


def client_bin(client: str) -> Path:
    """The client's console script in its own environment."""
    return Path(platformdirs.user_cache_dir("trtllm-kit")) / "eval-clients" / client / "bin" / client


def install(client: str) -> Path:
    """The client's environment, created and filled with its pinned release when absent; its console script."""
    script = client_bin(client)
    if not script.exists():
        env_dir = script.parents[1]
        venv.create(env_dir, with_pip=True, clear=True)
        subprocess.run([str(env_dir / "bin" / "pip"), "install", "--quiet", CLIENTS[client]], check=True)
    return script


def run_logged(command: list[str], log: Path, env: dict[str, str | None], timeout_s: float = 600) -> None:
    """Run ``command`` with ``env`` over the environment (None: the variable unset), its output into ``log``."""
    merged = {**os.environ, **env}
    with log.open("wb") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s,
                              env={k: v for k, v in merged.items() if v is not None})
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"{command[0]} failed (exit {done.returncode}):\n{tail}")


def guidellm(base_url: str, tokenizer: Path, num_requests: int, work: Path) -> ClientFigures:
    """guidellm's synchronous profile, ``num_requests`` synthetic chat requests; its request totals."""
    report = work / "guidellm.json"
    run_logged([str(install("guidellm")), "run", "--backend", f"kind=openai_http,target={base_url.removesuffix('/v1')}",
                "--profile", "kind=synchronous", "--constraint", f"kind=max_requests,count={num_requests}",
                "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
                "--tokenizer", f"kind=huggingface_auto,model={tokenizer}", "--output", f"kind=json,path={report}",
                "--disable-console-interactive"],
               work / "guidellm.log", env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    totals = json.loads(report.read_text())["benchmarks"][0]["metrics"]["request_totals"]
    return ClientFigures("guidellm", num_requests, totals["successful"], totals["errored"] + totals["incomplete"])


def aiperf(base_url: str, tokenizer: Path, num_requests: int, work: Path) -> ClientFigures:
    """aiperf's profile of ``num_requests`` streamed chat requests, two at a time; its per-request records.

    Not offline: aiperf's offline mode looks a tokenizer up in the hub cache only, so a local directory fails
    there; outside it, a local directory is read as it is, without the network.
    """
    artifacts = work / "aiperf"
    run_logged([str(install("aiperf")), "profile", "--model", MODEL, "--url", base_url.removesuffix("/v1"),
                "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer),
                "--request-count", str(num_requests), "--concurrency", "2", "--isl", str(PROMPT_TOKENS),
                "--osl", str(OUTPUT_TOKENS), "--extra-inputs", "ignore_eos:true", "--random-seed", "1",
                "--artifact-dir", str(artifacts), "--ui", "none", "--no-gpu-telemetry"],
               work / "aiperf.log", env={"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None})
    records = [json.loads(line) for line in (artifacts / "profile_export.jsonl").read_text().splitlines()]
    num_errors = sum(1 for r in records if r.get("error") is not None)
    return ClientFigures("aiperf", num_requests, len(records) - num_errors, num_errors)


@contextmanager
def given(base_url: str) -> Iterator[str]:
    yield base_url.rstrip("/")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="an OpenAI base URL (…/v1) serving builtin:tiny-llama")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--install-only", action="store_true", help="create the clients' environments and stop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.install_only:
        for client in CLIENTS:
            print(install(client))
        return
    tokenizer = builtin_dir("tiny-llama")
    with tempfile.TemporaryDirectory() as tmp, \
            (given(args.base_url) if args.base_url else served_build(MODEL, Path(tmp) / "out")) as url:
        figures = [run(url, tokenizer, args.requests, Path(tmp)) for run in (guidellm, aiperf)]
    if args.json:
        print(json.dumps([asdict(f) for f in figures], indent=2))
        return
    for f in figures:
        print(f"{f.client:9} {f.num_completed}/{f.num_requests} requests completed, {f.num_errors} errors")


if __name__ == "__main__":
    main()
