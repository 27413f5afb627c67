"""lm-eval through the served model against lm-eval on the model itself: per task, the accuracy, the mean
loglikelihood and the largest per-request difference, for a float32 cpu build and an FP8 one.

    python benchmarks/eval_parity.py [--model tiny-llama] [--base-url URL] [--no-fp8] [--json]

Runs the real ``lm-eval`` twice or three times, each in a process of its own (its ``simple_evaluate``, as its
``lm-eval run`` command calls it, with a task index of only the two local tasks of ``tests/data/eval``, not the
thousands of YAML files of its built-in tasks), on ``kit_last_word`` (loglikelihood) and ``kit_word_choice``
(multiple choice): ``--model hf`` on the built-in model's Hugging Face directory in float32, and
``--model local-completions`` against ``trtllm-kit serve`` of the same model
built for the cpu target in float32 (or the server at ``--base-url``) and built with ``--quant fp8``. Both send the
same token ids (``add_bos_token=True`` on both sides; the served side is given the HF directory as its tokenizer).
Offline: ``HF_HUB_OFFLINE`` and ``HF_DATASETS_OFFLINE`` are set. The built-in models have random weights, so the
accuracies are near chance except where the task's samples were chosen with the model (see the task YAMLs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from served import served_build  # noqa: E402

from trtllm_kit.models.builtin import builtin_dir  # noqa: E402

TASKS_DIR = ROOT / "tests" / "data" / "eval"
TASKS = ("kit_last_word", "kit_word_choice")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class TaskFigures:
    """One task of one lm-eval run, beside the same task of the reference run (``--model hf``)."""

    task: str
    run: str
    accuracy: dict[str, float]  # metric → value (acc, acc_norm)
    mean_loglikelihood: float  # over every scored request (each choice of a multiple-choice sample)
    max_abs_difference: float  # per request, against the reference run
    num_requests: int
    mismatched: list[tuple[int, int, float, float]]  # (doc_id, choice, reference, this) beyond 1e-3


def lm_eval_command(model: str, model_args: dict[str, str], out: Path, **options: object) -> list[str]:
    """The command that runs lm-eval (``run_lm_eval``) on both tasks, its figures written into ``out``."""
    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    return [sys.executable, __file__, "--lm-eval", json.dumps({"model": model, "model_args": args, **options}),
            str(out)]


def run_lm_eval(options: dict[str, object], out: Path) -> None:
    """lm-eval's ``simple_evaluate`` on both tasks with ``options`` (model, model_args, batch_size, device) and the
    ``lm-eval run`` command's defaults; each task's results and each request's loglikelihood, by doc_id and choice,
    written into ``out`` as JSON. Run in the tasks' directory (their data_files are relative to it).

    Arguments:
        options: ``simple_evaluate``'s keyword arguments; out: the JSON file.
    """
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(**{"batch_size": 1, **options}, tasks=list(TASKS), log_samples=True,
                              task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False))
    assert results is not None
    out.write_text(json.dumps({task: {
        "results": results["results"][task],
        "loglikelihoods": [[sample["doc_id"], choice, float(response[0][0])]
                           for sample in results["samples"][task] for choice, response in enumerate(sample["resps"])],
    } for task in TASKS}))


def hf_args(hf_dir: Path) -> dict[str, str]:
    return {"pretrained": str(hf_dir), "dtype": "float32", "add_bos_token": "True"}


def served_args(hf_dir: Path, base_url: str, model: str) -> dict[str, str]:
    return {"model": model, "base_url": f"{base_url}/completions", "tokenizer": str(hf_dir),
            "tokenizer_backend": "huggingface", "add_bos_token": "True", "num_concurrent": "2", "max_retries": "1"}


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``command`` started in the tasks' directory (their data_files are relative to it), offline."""
    with log.open("wb") as sink:
        return subprocess.Popen(command, cwd=TASKS_DIR, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, **OFFLINE, "PYTHONPATH": str(ROOT)})


def finish(process: subprocess.Popen[bytes], log: Path, timeout_s: float = 900) -> None:
    if process.wait(timeout=timeout_s) != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"{' '.join(map(str, process.args))} failed (exit {process.returncode}):\n{tail}")


def read_run(out: Path, task: str) -> tuple[dict[str, float], dict[tuple[int, int], float]]:
    """The accuracy metrics of ``task`` and each request's loglikelihood, by (doc_id, choice), from a run's figures."""
    run = json.loads(out.read_text())[task]
    accuracy = {k.split(",")[0]: v for k, v in run["results"].items() if k.split(",")[0] in ("acc", "acc_norm")}
    return accuracy, {(doc_id, choice): loglikelihood for doc_id, choice, loglikelihood in run["loglikelihoods"]}


def compare(reference: Path, other: Path, run: str) -> list[TaskFigures]:
    """Each task of ``other`` beside the same task of ``reference``."""
    figures = []
    for task in TASKS:
        _, expected = read_run(reference, task)
        accuracy, found = read_run(other, task)
        assert found.keys() == expected.keys(), f"{run}: {task} scored other requests than the reference"
        differences = {key: abs(found[key] - expected[key]) for key in expected}
        figures.append(TaskFigures(
            task, run, accuracy, sum(found.values()) / len(found), max(differences.values()), len(found),
            [(*key, expected[key], found[key]) for key, d in sorted(differences.items()) if d > 1e-3]))
    return figures


def evaluate(hf_model: str, work: Path, base_url: str | None, with_fp8: bool) -> list[TaskFigures]:
    """Both tasks through ``--model hf`` and through the server (float32, and FP8 when asked), compared."""
    hf_dir, served_name = builtin_dir(hf_model), f"builtin:{hf_model}"
    reference = start(lm_eval_command("hf", hf_args(hf_dir), work / "hf", device="cpu", batch_size=8),
                      work / "hf.log")
    float32_build = served_build(served_name, work / "f32", "--dtype", "float32")
    with float32_build if base_url is None else _given(base_url) as url:
        float32 = start(lm_eval_command("local-completions", served_args(hf_dir, url, served_name), work / "f32-eval"),
                        work / "f32.log")
        finish(float32, work / "f32.log")
    finish(reference, work / "hf.log")
    figures = compare(work / "hf", work / "hf", "hf") + compare(work / "hf", work / "f32-eval", "served float32")
    if with_fp8:
        with served_build(served_name, work / "fp8", "--dtype", "float32", "--quant", "fp8") as url:
            fp8 = start(lm_eval_command("local-completions", served_args(hf_dir, url, served_name), work / "fp8-eval"),
                        work / "fp8.log")
            finish(fp8, work / "fp8.log")
        figures += compare(work / "hf", work / "fp8-eval", "served fp8")
    return figures


@contextmanager
def _given(base_url: str) -> Iterator[str]:
    yield base_url.rstrip("/")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama", help="a built-in model's name")
    parser.add_argument("--base-url", help="an OpenAI base URL already serving the float32 build (…/v1)")
    parser.add_argument("--no-fp8", action="store_true", help="skip the FP8 build")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--lm-eval", nargs=2, metavar=("OPTIONS", "OUT"), help=argparse.SUPPRESS)  # one run's child
    args = parser.parse_args(argv)
    if args.lm_eval:
        run_lm_eval(json.loads(args.lm_eval[0]), Path(args.lm_eval[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        figures = evaluate(args.model, Path(tmp), args.base_url, not args.no_fp8)
    if args.json:
        print(json.dumps([asdict(f) for f in figures], indent=2))
        return
    by_run = {(f.run, f.task): f for f in figures}
    for f in figures:
        base = by_run["served float32" if f.run == "served fp8" else "hf", f.task]
        accuracy = "  ".join(f"{k} {v:.4f} ({v - base.accuracy[k]:+.4f})" for k, v in sorted(f.accuracy.items()))
        print(f"{f.task:16} {f.run:15} {accuracy}  mean loglikelihood {f.mean_loglikelihood:.4f} "
              f"({f.mean_loglikelihood - base.mean_loglikelihood:+.4f})  max |diff| vs hf "
              f"{f.max_abs_difference:.2e} over {f.num_requests} requests"
              + (f", {len(f.mismatched)} beyond 1e-3" if f.mismatched else ""))
    print("(in parentheses: the difference from lm-eval --model hf in float32; for fp8, from the served float32)")


if __name__ == "__main__":
    main()
