"""The optimisation recipe of the PyTorch-backend path and its memory model, chosen per precision and GPU.

There is no engine build: what ``trtllm-build`` flags fixed for the engine target are runtime ``TorchLlmArgs``
here (docs/llmapi.md §5). The recipe: decode CUDA graphs with padding for every batch up to the planned
``max_batch_size`` (NVIDIA's dense-model recipe), the overlap scheduler on, the TRTLLM attention backend (fused
RoPE; the only one with an FP8 KV cache, which it runs with paged context FMHA), KV block reuse, chunked
prefill when a sequence can outgrow one iteration's token budget, and iteration statistics for the gauges.

Memory per rank (on top of the engine target's model, ``plan.py``, whose weights per rank are exactly the
PyTorch backend's load-time shards: column/row splits of each linear, KV heads duplicated when fewer than
tp, vocab rows of lm_head split): the CUDA-graph pool, one set of decode activations at the largest captured
batch plus ``GRAPH_OVERHEAD`` per captured graph (upstream: "each CUDA graph can use up to 200 MB"), is set
aside before the KV pool takes ``free_gpu_memory_fraction`` of what is left.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from trtllm_kit.artifact import LoraRecord
from trtllm_kit.build_limits import Limits
from trtllm_kit.gpus import GPU
from trtllm_kit.lora.settings import trtllm_modules
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.names import DRAFT_DIR
from trtllm_kit.plan import BuildPlan, activation_bytes, make_plan
from trtllm_kit.precision import Precision
from trtllm_kit.quant.algos import NVFP4_MIN_SM
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.draft_memory import draft_memory
from trtllm_kit.spec.speculative_support import NO_OVERLAP, mtp_layers, speculative_config

GRAPH_OVERHEAD = 8 * 1024 * 1024  # static inputs/outputs and workspace of one captured decode graph (estimate)
POLICIES = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}


def cuda_graph_batch_sizes(max_batch_size: int) -> list[int]:
    """The batch sizes ``CudaGraphConfig(enable_padding=True, max_batch_size=N)`` captures (1.2.x rule).

    Arguments:
        max_batch_size: the largest captured batch.
    """
    sizes = [1, 2, 4] + [8 * i for i in range(1, 17)]
    power = 256
    while power < max_batch_size:
        sizes.append(power)
        power *= 2
    sizes = sorted(s for s in sizes if s <= max_batch_size)
    return sizes if sizes and sizes[-1] == max_batch_size else [*sizes, max_batch_size]


@dataclass(frozen=True)
class LlmapiRecipe:
    """What the llmapi target runs with: ``TorchLlmArgs`` values, the memory plan and why, in words."""

    args: dict[str, Any]
    notes: tuple[str, ...]
    plan: BuildPlan | None
    cuda_graph_pool_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"llm_args": self.args, "notes": list(self.notes), "cuda_graph_pool_bytes": self.cuda_graph_pool_bytes,
                "plan": self.plan.to_dict() if self.plan else None}


def make_recipe(spec: BuildSpec, hf: HFConfig, family: Family, precision: Precision, gpu: GPU | None,
                lora: LoraRecord | None = None) -> LlmapiRecipe:
    """The recipe and memory plan of ``spec`` on ``gpu`` (no GPU: the spec's or the CPU defaults' sizes).

    Arguments:
        spec: the build spec; hf: model config; family: weight table; precision: dtype and quantization;
        gpu: the GPU planned for, or None; lora: the build's LoRA support (``lora_config``), or none.
    """
    b = spec.build
    mapping = Mapping(b.tp, b.pp)
    limits = Limits(b.max_batch_size, b.max_input_len, b.max_seq_len, b.max_num_tokens, b.tokens_per_block,
                    b.kv_cache_fraction, draft=draft_memory(spec.speculative, hf.raw, precision))
    plan, pool = None, 0
    if gpu is not None:
        first = make_plan(hf, family, mapping, precision, gpu, limits)
        sizes = cuda_graph_batch_sizes(first.max_batch_size)
        pool = activation_bytes(first.max_batch_size, hf.hidden_size, hf.intermediate_size, spec.build.tp) + \
            GRAPH_OVERHEAD * len(sizes)
        plan = make_plan(hf, family, mapping, precision, replace(gpu, memory_bytes=gpu.memory_bytes - pool), limits)
    batch = plan.max_batch_size if plan else spec.build.max_batch_size or 8
    seq_len = plan.max_seq_len if plan else spec.build.max_seq_len or min(hf.max_position_embeddings, 1024)
    tokens = plan.max_num_tokens if plan else spec.build.max_num_tokens or min(2048, batch * seq_len)
    chunked = spec.repo.enable_chunked_context if spec.repo.enable_chunked_context is not None else seq_len > tokens
    reuse = spec.repo.enable_kv_cache_reuse if spec.repo.enable_kv_cache_reuse is not None else True
    fp8_kv = precision.kv_cache_quant_algo == "FP8"
    kv: dict[str, Any] = {"dtype": "fp8" if fp8_kv else "auto", "free_gpu_memory_fraction": b.kv_cache_fraction,
                          "enable_block_reuse": reuse, "tokens_per_block": b.tokens_per_block}
    scheduler: dict[str, Any] = {"capacity_scheduler_policy": POLICIES[spec.repo.batch_scheduler_policy]}
    if chunked:
        scheduler["context_chunking_policy"] = "FIRST_COME_FIRST_SERVED"
    args: dict[str, Any] = {
        "backend": "pytorch", "tensor_parallel_size": spec.build.tp, "pipeline_parallel_size": spec.build.pp,
        "max_batch_size": batch, "max_num_tokens": tokens, "max_seq_len": seq_len,
        "kv_cache_config": kv, "enable_chunked_prefill": chunked, "scheduler_config": scheduler,
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": batch},
        "disable_overlap_scheduler": False, "attn_backend": "TRTLLM", "enable_iter_perf_stats": True,
        "guided_decoding_backend": "xgrammar",  # structured output (response_format, guided_json, ...)
    }
    if lora is not None:
        args["lora_config"] = lora_config(lora)
    speculation = spec.speculative
    draft = spec.out.absolute() / DRAFT_DIR if speculation.draft_model is not None else None  # the artifact's copy
    speculative = speculative_config(speculation, draft, mtp_layers(speculation, hf.raw))
    if speculative is not None:
        args["speculative_config"] = speculative
        args["disable_overlap_scheduler"] = speculation.mode in NO_OVERLAP
    notes = [
        f"decode CUDA graphs with padding for batches {_sizes(cuda_graph_batch_sizes(batch))} (max_batch_size "
        f"{batch})" + (f"; pool set aside: {pool / 2**20:.0f} MiB" if gpu is not None else ""),
        "overlap scheduler on: the CPU work of step n overlaps the GPU's step n+1 (one extra decode step, more "
        "throughput)" if not args["disable_overlap_scheduler"] else f"overlap scheduler off, as upstream's "
        f"{speculation.mode} examples run",
        "attention backend TRTLLM: RoPE fused into attention" + ("; FP8 KV cache with paged context FMHA and unit "
                                                                   "KV scales" if fp8_kv else ""),
        f"KV block reuse {'on' if reuse else 'off'}; chunked prefill {'on' if chunked else 'off'} "
        f"(max_seq_len {seq_len}, max_num_tokens {tokens})",
    ]
    if precision.quant_algo == "FP8":
        sm = gpu.compute_capability if gpu else None
        notes.append("FP8 per-tensor GEMMs (static input scales from calibration)"
                     + ("; small-M batches use the CUDA-core FP8 GEMM on this GPU" if sm in ((8, 9), (12, 0)) else ""))
    if precision.quant_algo == "NVFP4":
        sm = gpu.compute_capability if gpu else None
        where = "" if gpu is None or sm is None else (
            f"; {gpu.name} is SM {sm[0]}.{sm[1]}" + (", which cannot run it" if sm < NVFP4_MIN_SM else ""))
        notes.append(f"NVFP4 needs compute capability >= {NVFP4_MIN_SM[0]}.{NVFP4_MIN_SM[1]} (Blackwell){where}: "
                     "FP4 GEMMs on packed e2m1 weights with e4m3 block scales")
    if precision.quant_algo == "W4A16_AWQ":
        group = spec.quant_config().awq_group_size  # int4 is 1/4 of bf16's bytes; a float32 scale adds 2/group
        notes.append(f"W4A16 AWQ: int4 weights in groups of {group} with a float32 scale each, dequantized inside the "
                     "GEMM; activations stay in the model dtype (a pre_quant_scale multiplies the input of each linear "
                     "that reads it alone; q/k/v's and gate/up's shared one is in the norm before them); linear "
                     f"weights take about {0.25 + 2 / group:.2f} of their bf16 bytes")
    notes.append("iteration statistics on (enable_iter_perf_stats) for the nv_trt_llm_* gauges")
    if lora is not None:
        notes.append(f"LoRA on {', '.join(trtllm_modules(lora))} up to rank {lora.max_lora_rank}, {lora.max_loras} "
                     "adapters cached (each request names its adapter with a LoRARequest)")
    return LlmapiRecipe(args, tuple(notes), plan, pool)


def lora_config(lora: LoraRecord) -> dict[str, Any]:
    """``LoraConfig`` of the build's LoRA support: the target modules (TensorRT-LLM's names, so none is enabled
    beyond them), the highest rank, and ``max_loras`` adapters on the GPU and as many in host memory. ``lora_dir``
    stays empty: the loader takes one directory only, and each request brings its adapter's path.

    Arguments:
        lora: the build's LoRA support.
    """
    return {"lora_target_modules": trtllm_modules(lora), "max_lora_rank": lora.max_lora_rank,
            "max_loras": lora.max_loras, "max_cpu_loras": lora.max_loras}


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 8 else f"{', '.join(map(str, sizes[:6]))}, …, {sizes[-1]}"
