"""Artifacts to deploy: an engine build of a 70B model cannot run here, so its manifest is written through the
kit's own ``Artifact`` with the records a GPU build writes (plan, engine build, repository)."""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.artifact import (
    Artifact,
    CheckpointRecord,
    EngineBuild,
    EngineLimits,
    EngineRecord,
    ModelRecord,
    RepoRecord,
    StageRecords,
)
from trtllm_kit.gpus import gpu_from_table
from trtllm_kit.mapping import Mapping
from trtllm_kit.plan import BuildPlan, RankPlan
from trtllm_kit.precision import Precision
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.spec.tables import BuildOptions

LLMAPI_COMMAND = ["trtllm-serve", "/models/llama70b/checkpoint", "--host", "127.0.0.1", "--port", "8000", "--backend",
                  "pytorch", "--extra_llm_api_options", "/models/llama70b/trtllm-serve/extra_llm_api_options.yaml"]


def write_artifact(out: Path, *, target: str = "engine", tp: int = 8, pp: int = 1,
                   rank_bytes: int = 17 * 10**9, quant_algo: str | None = None, record_sizes: bool = True) -> Path:
    """A build output's manifest (and its small files) for ``target`` at tp x pp, written by the kit's ``Artifact``.
    The rank files stay on the GPU host: the manifest records their sizes as a build does (``output_stats``).

    Arguments:
        out: the directory; target: engine, cpu or llmapi; tp, pp: the layout; rank_bytes: weight bytes per rank;
        quant_algo: the checkpoint's quantization (weights and KV cache), e.g. FP8; record_sizes: record the sizes
        (False: a manifest without them).
    """
    (out / "repo" / "tensorrt_llm").mkdir(parents=True)
    config = out / "repo" / "tensorrt_llm" / "config.pbtxt"
    config.write_text('name: "tensorrt_llm"\n')
    model_dir = "engines" if target == "engine" else "checkpoint"
    files = {f"{model_dir}/rank{r}.{'engine' if target == 'engine' else 'safetensors'}": f"{r:064x}"
             for r in range(tp * pp)}
    files["repo/tensorrt_llm/config.pbtxt"] = "f" * 64
    if target != "llmapi":
        files["repo/tensorrt_llm_bls/config.pbtxt"] = "e" * 64
    if target == "llmapi":
        (out / "trtllm-serve").mkdir()
        (out / "trtllm-serve" / "extra_llm_api_options.yaml").write_text(
            f"backend: pytorch\ntensor_parallel_size: {tp}\npipeline_parallel_size: {pp}\n"
            "enable_iter_perf_stats: true\n")
        files["trtllm-serve/extra_llm_api_options.yaml"] = "d" * 64
    ranks = tuple(RankPlan(r, r % tp, r // tp, 1, rank_bytes, 0, 0, 0, 0, 0, 0, 0, 0, 0, True) for r in range(tp * pp))
    plan = BuildPlan(gpu=gpu_from_table("H100-80GB"), precision=Precision("bfloat16"), tp_size=tp, pp_size=pp,
                     max_batch_size=64, max_input_len=4096, max_seq_len=8192, max_num_tokens=8192,
                     tokens_per_block=32, kv_cache_fraction=0.9, derived=(), ranks=ranks)
    built = EngineBuild(dir="engines", world_size=tp * pp, tp_size=tp, pp_size=pp, tensorrt_llm="1.2.1",
                        tensorrt="10.14.1.48", cuda="13.0", driver="580.65.06", gpu="NVIDIA H100 80GB HBM3",
                        compute_capability="9.0") if target == "engine" else None
    source = "meta-llama/Llama-3.1-70B-Instruct"
    records = StageRecords(
        model=ModelRecord(source, "/models/hf/llama70b", "llama", "LlamaForCausalLM", 70_553_706_496),
        checkpoint=CheckpointRecord("checkpoint", "bfloat16", tp * pp, tp, pp,
                                    {"quant_algo": quant_algo, "kv_cache_quant_algo": quant_algo} if quant_algo
                                    else None),
        engine=EngineRecord(target, "built on a GPU host", plan=plan if target == "engine" else None, built=built,
                            command=LLMAPI_COMMAND if target == "llmapi" else None),
        repo=RepoRecord("repo", "", target, ["tensorrt_llm"], False, f"/models/llama70b/{model_dir}",
                        EngineLimits(target, Path(model_dir), 64, 8192, 4096, 1, 32, True, tp, pp), RepoOptions()),
        stages=["checkpoint", "engine", "repo"])
    Artifact(path=out, spec=BuildSpec(model=source, out=out, build=BuildOptions(tp=tp, pp=pp, target=target)),
             target=target,
             layout=Mapping(tp, pp), precision=Precision("bfloat16"), records=records, files=files,
             file_stats={name: [rank_bytes if "/rank" in name else 64, 0] for name in files} if record_sizes
             else {}).write()
    return out
