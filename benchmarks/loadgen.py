"""The load generator's own capacity and timing, against real servers on this machine.

    python benchmarks/loadgen.py [--requests 1500] [--concurrency 32] [--repeat 3] [--aiperf PATH] [--json]

1. Capacity (gRPC streaming): tritonserver (nvidia-pytriton wheel, CPU) serving a zero-work ``tensorrt_llm``
   stand-in (Python backend, no delay). The harness (``closed_loop`` + ``TritonStreamClient``: one asyncio loop)
   against a plain multi-threaded ``tritonclient.grpc`` loop (one thread, client and stream per slot), same
   tensors, same concurrency; requests/s with OSL 1 and streamed chunks/s with OSL 32. Runs interleave;
   the median of ``--repeat`` counts.
2. Timing overhead: at concurrency 1 against a stand-in with a 20 ms first token, client TTFT minus the
   server's own TTFT (``first_token_time_ns − arrival_time_ns``), and the harness's event-loop lag.
3. Agreement with NVIDIA AIPerf: both drive the same OpenAI endpoint at concurrency 4, ISL 128 / OSL 32
   (forced with ``min_tokens`` and ``ignore_eos``); medians of TTFT, TPOT (AIPerf's "ITL") and output tok/s.
   Two endpoints: an SSE stand-in (20 ms to the first token, then 10 ms per token, so the true figures are
   known) and ``trtllm-kit serve --openai-port`` serving the built-in tiny Llama on the CPU runtime (the harness
   sends token ids, AIPerf text of the same token count). AIPerf runs from its own venv (``--aiperf``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "profile" / "standin"))

from servers import OpenAIStandin, TritonServer, write_repo  # noqa: E402

from trtllm_kit.model_repo.tensors import NEVER_END_ID  # noqa: E402
from trtllm_kit.profile.clients import TritonStreamClient  # noqa: E402
from trtllm_kit.profile.loadgen import closed_loop  # noqa: E402
from trtllm_kit.profile.metrics import stats, summarize  # noqa: E402
from trtllm_kit.profile.openai_client import OpenAIStreamClient  # noqa: E402
from trtllm_kit.profile.prompt_text import text_decoder  # noqa: E402
from trtllm_kit.profile.workload import Prompt, WorkloadSpec, synthetic_prompts  # noqa: E402

AIPERF_TIMEOUT_S = 300  # 200 requests take about 30 s; AIPerf's timing manager has been seen to spin forever


@dataclass
class Figures:
    capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    overhead: dict[str, float] = field(default_factory=dict)
    aiperf: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # endpoint → tool → figures


def harness_run(url: str, prompts: list[Prompt], concurrency: int) -> tuple[float, float, float]:
    """requests/s, chunks/s and event-loop lag p99 (ms) of the harness."""
    async def main():
        client = TritonStreamClient(url)
        await closed_loop(client, prompts[:concurrency], concurrency)  # warm-up
        phase = await closed_loop(client, prompts[concurrency:], concurrency)
        await client.close()
        return phase

    phase = asyncio.run(main())
    seconds = (phase.window_ns[1] - phase.window_ns[0]) / 1e9
    ok = [r for r in phase.records if r.ok and r.osl_observed == r.osl_requested]
    assert len(ok) == len(phase.records), f"{len(phase.records) - len(ok)} requests failed"
    chunks = sum(len(r.chunks) for r in ok)
    return len(ok) / seconds, chunks / seconds, stats(phase.loop_lag_ms).get("p99", 0.0)


def plain_run(url: str, prompts: list[Prompt], concurrency: int) -> tuple[float, float]:
    """requests/s and chunks/s of a plain threaded tritonclient loop."""
    import tritonclient.grpc as grpcclient

    def inputs(p: Prompt) -> list:
        tensors = [("input_ids", np.asarray([p.input_ids], np.int32))] + [
            (k, np.array([[v]], np.int32)) for k, v in (("input_lengths", p.isl), ("request_output_len", p.osl),
                                                        ("min_tokens", p.osl), ("end_id", NEVER_END_ID))] + [
            (k, np.array([[True]])) for k in ("streaming", "exclude_input_in_output", "return_num_output_tokens",
                                              "return_perf_metrics")]
        out = []
        for name, array in tensors:
            tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == bool else "INT32")
            tensor.set_data_from_numpy(array)
            out.append(tensor)
        return out

    counts = [[0, 0] for _ in range(concurrency)]
    slices = [prompts[i::concurrency] for i in range(concurrency)]
    barrier = threading.Barrier(concurrency + 1)

    def worker(slot: int) -> None:
        client = grpcclient.InferenceServerClient(url.removeprefix("grpc://"))
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        warm, measured = slices[slot][:1], slices[slot][1:]
        for phase, batch in (("warm", warm), ("measure", measured)):
            if phase == "measure":
                barrier.wait()
            for p in batch:
                client.async_stream_infer("tensorrt_llm", inputs(p), request_id=p.request_id,
                                          enable_empty_final_response=True)
                while True:
                    result, error = responses.get()
                    if error is not None:
                        raise RuntimeError(str(error))
                    if result.as_numpy("output_ids") is not None and phase == "measure":
                        counts[slot][1] += 1
                    if result.get_response().parameters["triton_final_response"].bool_param:
                        break
                counts[slot][0] += phase == "measure"
        client.stop_stream()
        client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.monotonic()
    for t in threads:
        t.join()
    seconds = time.monotonic() - start
    return sum(c[0] for c in counts) / seconds, sum(c[1] for c in counts) / seconds


def capacity(args: argparse.Namespace, work: Path, figures: Figures) -> None:
    with TritonServer(write_repo(work / "zero"), work / "zero") as server:
        for name, osl in (("osl1", 1), ("osl32", 32)):
            count = args.requests if osl == 1 else max(args.requests // 8, 4 * args.concurrency)
            kit, plain, lags = [], [], []
            for repeat in range(args.repeat):
                prompts = synthetic_prompts(WorkloadSpec(isl=16, osl=osl, seed=repeat), count + args.concurrency)
                req_s, chunk_s, lag = harness_run(server.grpc_url, prompts, args.concurrency)
                kit.append((req_s, chunk_s))
                lags.append(lag)
                plain.append(plain_run(server.grpc_url, prompts, args.concurrency))
            med = lambda rows, i: statistics.median(r[i] for r in rows)  # noqa: E731
            figures.capacity[name] = {"harness_req_per_s": med(kit, 0), "harness_chunks_per_s": med(kit, 1),
                                      "plain_req_per_s": med(plain, 0), "plain_chunks_per_s": med(plain, 1),
                                      "ratio": med(kit, 0) / med(plain, 0), "loop_lag_p99_ms": max(lags)}


def overhead(args: argparse.Namespace, work: Path, figures: Figures) -> None:
    with TritonServer(write_repo(work / "slow", 20, 20), work / "slow") as server:
        prompts = synthetic_prompts(WorkloadSpec(isl=128, osl=8), 60)

        async def main():
            client = TritonStreamClient(server.grpc_url)
            await closed_loop(client, prompts[:5], 1)
            phase = await closed_loop(client, prompts[5:], 1)
            await client.close()
            return phase

        phase = asyncio.run(main())
    gaps = [((r.chunks[0][0] - r.t_send_ns) - (r.server["first_token_ns"] - r.server["arrival_ns"])) / 1e6
            for r in phase.records]
    figures.overhead = {"ttft_minus_server_ttft_p50_ms": float(np.median(gaps)),
                        "ttft_minus_server_ttft_p99_ms": float(np.percentile(gaps, 99)),
                        "loop_lag_p99_ms": stats(phase.loop_lag_ms)["p99"]}


def compare_with_aiperf(args: argparse.Namespace, work: Path, url: str, model: str, tokenizer: Path,
                        vocab_size: int, text: bool = False) -> dict[str, dict[str, float]]:
    """Medians of the harness and of AIPerf on one OpenAI endpoint: c=4, ISL 128 / OSL 32, 200 requests.
    With ``text`` the harness sends its prompts as text, as AIPerf does, so both take the same server path."""
    count, concurrency, isl, osl = 200, 4, 128, 32
    prompts = synthetic_prompts(WorkloadSpec(isl=isl, osl=osl, vocab_size=vocab_size), count + 8)

    async def main():
        client = OpenAIStreamClient(url, model, text_of=text_decoder(tokenizer) if text else None)
        await closed_loop(client, prompts[:8], concurrency)
        phase = await closed_loop(client, prompts[8:], concurrency)
        await client.close()
        return phase

    records = asyncio.run(main()).records
    assert all(r.ok and r.osl_observed == osl == r.osl_server for r in records), "harness requests failed"
    s = summarize(records)
    isl_seen = [r.server.get("prompt_tokens", r.isl) for r in records]
    figures = {"harness": {"ttft_p50_ms": s["ttft_ms"]["p50"], "tpot_p50_ms": s["tpot_ms"]["p50"],
                           "itl_p50_ms": s["itl_ms"]["p50"], "output_tok_per_s": s["output_tok_per_s"],
                           "isl_mean": statistics.mean(isl_seen)}}
    if not args.aiperf or not Path(args.aiperf).exists():
        return figures
    try:
        figures["aiperf"] = run_aiperf(args.aiperf, work, url, model, tokenizer, concurrency, count, isl, osl)
    except subprocess.TimeoutExpired:
        print(f"aiperf did not finish within {AIPERF_TIMEOUT_S} s against {url}; its figures are left out",
              file=sys.stderr)
    return figures


def run_aiperf(aiperf: str, work: Path, url: str, model: str, tokenizer: Path, concurrency: int, count: int,
               isl: int, osl: int) -> dict[str, float]:
    """AIPerf's medians on the same endpoint and workload (text prompts of ``isl`` tokens, forced ``osl``)."""
    artifacts = work / f"aiperf-{model.replace(':', '-')}"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # its offline path rejects local dirs
    argv = [aiperf, "profile", "-m", model, "--url", url.removesuffix("/v1"),
            "--endpoint-type", "completions", "--streaming", "--concurrency", str(concurrency),
            "--request-count", str(count), "--isl", str(isl), "--isl-stddev", "0", "--osl", str(osl),
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{osl}",
            "--tokenizer", str(tokenizer), "--use-server-token-count", "--random-seed", "0",
            "--warmup-request-count", "8", "--artifact-dir", str(artifacts), "--ui-type", "none",
            "--no-gpu-telemetry", "--no-server-metrics"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=AIPERF_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its services are processes of their own
        proc.wait()
        raise
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv, stderr=stderr)
    result = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    return {"ttft_p50_ms": result["time_to_first_token"]["p50"], "tpot_p50_ms": result["inter_token_latency"]["p50"],
            "output_tok_per_s": result["output_token_throughput"]["avg"],
            "isl_mean": result["input_sequence_length"]["avg"]}


def agreement(args: argparse.Namespace, work: Path, figures: Figures) -> None:
    """AIPerf next to the harness on the OpenAI stand-in (20 ms to the first token, then 10 ms per token) and
    on the kit's own OpenAI frontend serving the built-in tiny Llama on the CPU runtime."""
    from trtllm_kit.build.pipeline import run_build
    from trtllm_kit.models.builtin import builtin_dir
    from trtllm_kit.serve.server.launcher import free_endpoints, free_port
    from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
    from trtllm_kit.spec import ServeSettings, build_spec

    tokenizer = builtin_dir("tiny-llama")
    with OpenAIStandin(20, 10) as server:
        figures.aiperf["standin"] = compare_with_aiperf(args, work, server.url, "standin", tokenizer, 1000)
    out = work / "tiny-llama"
    one_each = {"preprocessing_instances": 1, "postprocessing_instances": 1, "bls_instances": 1}
    run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out, "build": {"verify": False}, "repo": one_each}))
    endpoints, openai_port = free_endpoints(), free_port()
    settings = ServeSettings(**asdict(endpoints), ready_timeout_s=120, openai_port=openai_port)
    serve_detached(ServeOptions(out=out, settings=settings))
    try:
        figures.aiperf["served"] = compare_with_aiperf(args, work, f"http://127.0.0.1:{openai_port}/v1",
                                                       "builtin:tiny-llama", out / "tokenizer", 1024, text=True)
    finally:
        stop_serving(out, 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1500, help="Measured requests per capacity run (OSL 1).")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--aiperf", default=shutil.which("aiperf"),
                        help="The aiperf executable (default: on PATH; install it in a venv of its own: pip install "
                        "aiperf). Without it the AIPerf comparison is skipped.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = Figures()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("TRTLLM_KIT_CACHE", str(Path(tmp) / "cache"))
        capacity(args, Path(tmp), figures)
        overhead(args, Path(tmp), figures)
        agreement(args, Path(tmp), figures)
    if args.json:
        print(json.dumps(asdict(figures), indent=2))
        return
    for name, c in figures.capacity.items():
        print(f"capacity {name} c={args.concurrency}: harness {c['harness_req_per_s']:.0f} req/s "
              f"{c['harness_chunks_per_s']:.0f} chunks/s, plain tritonclient threads {c['plain_req_per_s']:.0f} "
              f"req/s {c['plain_chunks_per_s']:.0f} chunks/s, ratio {c['ratio']:.2f}, "
              f"loop lag p99 {c['loop_lag_p99_ms']:.1f} ms")
    o = figures.overhead
    print(f"timing: client TTFT - server TTFT p50 {o['ttft_minus_server_ttft_p50_ms']:.2f} ms, "
          f"p99 {o['ttft_minus_server_ttft_p99_ms']:.2f} ms; loop lag p99 {o['loop_lag_p99_ms']:.2f} ms")
    for endpoint, tools in figures.aiperf.items():
        for tool, f in tools.items():
            print(f"{endpoint} {tool:>8}: TTFT p50 {f['ttft_p50_ms']:.2f} ms, TPOT p50 {f['tpot_p50_ms']:.2f} ms, "
                  f"out {f['output_tok_per_s']:.1f} tok/s (input {f['isl_mean']:.1f} tokens on average)")
        if len(tools) == 2:
            h, a = tools["harness"], tools["aiperf"]
            print(f"{endpoint} harness/aiperf: " + ", ".join(f"{k} {h[k] / a[k]:.3f}" for k in a if k != "isl_mean"))

if __name__ == "__main__":
    main()
