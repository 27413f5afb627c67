"""The ``[build]``, ``[quant]`` and ``[serve]`` tables of a spec, each field declared once (``[repo]`` is
``spec.repo_options.RepoOptions``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.defaults import (
    DEFAULT_ENGINE_WATCHDOG_S,
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_KV_CACHE_FRACTION,
    DEFAULT_MAX_LORA_RANK,
    DEFAULT_MAX_LORAS,
    DEFAULT_METRICS_PORT,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_TOKENS_PER_BLOCK,
)
from trtllm_kit.enums import CalibDtype, Dtype, KVCache, Quant, Router, Server, Stage, Target
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import AWQ_GROUP_SIZE
from trtllm_kit.option import check_declared, option
from trtllm_kit.quant.algos import (
    DEFAULT_CALIB_SEED,
    DEFAULT_SMOOTHQUANT_ALPHA,
    QuantConfig,
)
from trtllm_kit.spec.build_flags import parse_overrides

LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block")


def parse_adapters(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``["support=./adapter", ...]`` → ``{"support": "./adapter"}`` (``build --lora``).

    Arguments:
        pairs: ``NAME=DIR`` strings.
    """
    result: dict[str, str] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise KitUsageError(f"--lora {pair!r} is not NAME=DIR (e.g. support=./support-adapter).")
        result[name.strip()] = path.strip()
    return result


@dataclass(frozen=True)
class BuildOptions:
    """The ``[build]`` table: parallel layout, dtype, stages, target, and the engine's memory plan and limits
    (None: planned)."""

    tp: int = field(default=1, metadata=option("Tensor-parallel size.", "--tp", minimum=1))
    pp: int = field(default=1, metadata=option("Pipeline-parallel size.", "--pp", minimum=1))
    dtype: Dtype = field(default=Dtype.AUTO, metadata=option(
        "Checkpoint dtype; auto takes the model's (float32 → float16).", "--dtype"))
    until: Stage = field(default=Stage.REPO, metadata=option("Last stage to run (or plan).", "--until"))
    target: Target = field(default=Target.AUTO, metadata=option(
        "engine: compile with trtllm-build; cpu: no compile; auto: engine when a GPU and tensorrt_llm are "
        "present.", "--target"))
    verify: bool | None = field(default=None, metadata=option(
        "Check the checkpoint against transformers on the CPU (default: on for models up to 500M parameters; "
        "part of the checkpoint's cache key).", "--verify/--no-verify"))
    allow_pickle: bool = field(default=False, metadata=option(
        "Accept .bin/.pt weights (loaded with weights_only=True).", "--allow-pickle"))
    force: bool = field(default=False, metadata=option(
        "Rebuild every stage, ignoring the stage cache, and replace --out even when it holds files that are not a "
        "trtllm-kit artifact. Without it, a build into an existing artifact already replaces it (atomically), "
        "reusing the stages whose inputs did not change.", "--force"))
    archive: Path | None = field(default=None, metadata=option(
        "Also pack the artifact into FILE (.tar, .tar.gz).", "--archive"))
    gpu: str | None = field(default=None, metadata=option(
        "Plan for this GPU: H100-80GB, H200, A100-80GB, A100-40GB, L40S, L4, A10G, ... (default: the visible "
        "GPU).", "--gpu"))
    gpu_memory: float | None = field(default=None, metadata=option(
        "Plan for this much GPU memory in GiB.", "--gpu-memory"))
    kv_cache_fraction: float = field(default=DEFAULT_KV_CACHE_FRACTION, metadata=option(
        "Share of the memory left after weights and activations given to the KV cache (also the repository's "
        "kv_cache_free_gpu_mem_fraction).", "--kv-cache-fraction"))
    max_batch_size: int | None = field(default=None, metadata=option(
        "Default: the sequences of max_seq_len that fit (<= 256).", "--max-batch-size", minimum=1))
    max_input_len: int | None = field(default=None, metadata=option(
        "Default: max_seq_len / 2, at most max_num_tokens.", "--max-input-len", minimum=1))
    max_seq_len: int | None = field(default=None, metadata=option(
        "Default: the model's max_position_embeddings.", "--max-seq-len", minimum=1))
    max_num_tokens: int | None = field(default=None, metadata=option(
        "Default: min(8192, max_batch_size x max_seq_len).", "--max-num-tokens", minimum=1))
    tokens_per_block: int = field(default=DEFAULT_TOKENS_PER_BLOCK, metadata=option(
        "Paged KV block size (a power of two).", "--tokens-per-block", minimum=1))
    context_logits: bool = field(default=False, metadata=option(
        "Build the engine with trtllm-build --gather_context_logits, so requests can return the prompt's logits "
        "(prompt logprobs: OpenAI echo with logprobs, lm-eval loglikelihood). Costs a float32 buffer of "
        "max_num_tokens x vocab per rank, shown by plan.", "--context-logits"))
    max_lora_rank: int = field(default=DEFAULT_MAX_LORA_RANK, metadata=option(
        "The highest LoRA rank an adapter of this artifact may have (trtllm-kit lora add refuses higher ones).",
        "--max-lora-rank", minimum=1))
    max_loras: int = field(default=DEFAULT_MAX_LORAS, metadata=option(
        "LoRA adapters held at once in the adapter cache (llmapi LoraConfig.max_loras, the CPU runtime's "
        "lora_cache_max_adapters); the least recently used is evicted. plan shows its memory.", "--max-loras",
        minimum=1))
    lora_target_modules: str | None = field(default=None, metadata=option(
        "The modules adapters may target, comma-separated, in PEFT's names (q_proj,v_proj) or TensorRT-LLM's "
        "(attn_q,attn_v), for a build without --lora; default: the modules of the --lora adapters.",
        "--lora-target-modules"))
    lora: dict[str, str] = field(default_factory=dict, metadata=option(
        "Add a PEFT LoRA adapter as NAME (repeatable; as trtllm-kit lora add, inside the build); in TOML the "
        "[build.lora] table.", "--lora", multiple=True, metavar="NAME=DIR", parse=parse_adapters))
    build_flags: dict[str, str] = field(default_factory=dict, metadata=option(
        "Override a trtllm-build recipe flag (repeatable), e.g. gemm_plugin=disable; in TOML the "
        "[build.build_flags] table.", "--build-flag", multiple=True, metavar="NAME=VALUE", parse=parse_overrides))

    def __post_init__(self) -> None:
        check_declared(self, "build")
        if self.tokens_per_block & (self.tokens_per_block - 1):
            raise KitUsageError(f"tokens_per_block must be a power of two (32 and 64 are common), got "
                                f"{self.tokens_per_block}.")
        if not 0 < self.kv_cache_fraction <= 1:
            raise KitUsageError(f"kv_cache_fraction must be a number in (0, 1], got {self.kv_cache_fraction!r}.")
        if self.gpu_memory is not None and self.gpu_memory <= 0:
            raise KitUsageError(f"gpu_memory must be a positive number of GiB, got {self.gpu_memory!r}.")
        if not all(isinstance(v, str) for v in self.lora.values()):
            raise KitUsageError(f"lora must be a table of NAME = \"ADAPTER_DIR\", got {self.lora!r}.")
        if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in self.build_flags.values()):
            raise KitUsageError(f"build_flags must be a table of NAME = \"VALUE\", got {self.build_flags!r}.")


@dataclass(frozen=True)
class QuantOptions:
    """The ``[quant]`` table: quantization algorithm, KV cache, SmoothQuant options and calibration."""

    quant: Quant = field(default=Quant.NONE, metadata=option(
        "Weights/activations: INT8 weight-only (W8A16), INT8 SmoothQuant, FP8.", "--quant"))
    kv_cache: KVCache = field(default=KVCache.AUTO, metadata=option(
        "KV-cache precision (auto: the model dtype).", "--kv-cache"))
    smoothquant_alpha: float = field(default=DEFAULT_SMOOTHQUANT_ALPHA, metadata=option(
        "SmoothQuant migration strength α in [0, 1].", "--smoothquant-alpha"))
    per_channel: bool = field(default=False, metadata=option(
        "SmoothQuant: per-channel weight scales.", "--per-channel"))
    per_token: bool = field(default=False, metadata=option(
        "SmoothQuant: dynamic per-token activation scales.", "--per-token"))
    calib_data: str | None = field(default=None, metadata=option(
        "Calibration text: .txt (one text per line) or .jsonl with a \"text\" field (default: the corpus shipped "
        "with trtllm-kit).", "--calib-data"))
    # ranges checked by QuantConfig, whose messages name the flags
    calib_samples: int | None = field(default=None, metadata=option(
        "Calibration windows (default: 512 on a GPU, as upstream; 16 on a CPU, where 512 x 512 tokens would take "
        "days for a 7B model).", "--calib-samples"))
    calib_seq_len: int | None = field(default=None, metadata=option(
        "Tokens per window (default: 512 on a GPU; 64 on a CPU).", "--calib-seq-len"))
    calib_seed: int = field(default=DEFAULT_CALIB_SEED, metadata=option(
        "Seed of the window offsets.", "--calib-seed"))
    calib_dtype: CalibDtype = field(default=CalibDtype.BFLOAT16, metadata=option(
        "Dtype calibration computes in (bfloat16, as ModelOpt; float32 for ranges free of bfloat16 rounding).",
        "--calib-dtype"))
    awq_group_size: int = field(default=AWQ_GROUP_SIZE, metadata=option(
        "INT4 AWQ: input features per weight scale, 64 or 128 (recorded as the checkpoint's group_size).",
        "--awq-group-size"))

    def __post_init__(self) -> None:
        check_declared(self, "quant")
        self.quant_config()  # refuses invalid combinations

    def quant_config(self) -> QuantConfig:
        """The table as the quantizer takes it (validated: refuses invalid combinations)."""
        return QuantConfig(quant=self.quant, kv_cache=self.kv_cache, smoothquant_alpha=self.smoothquant_alpha,
                           per_channel=self.per_channel, per_token=self.per_token,
                           calib_data=Path(self.calib_data) if self.calib_data else None,
                           calib_samples=self.calib_samples, calib_seq_len=self.calib_seq_len,
                           calib_seed=self.calib_seed, calib_dtype=self.calib_dtype,
                           awq_group_size=self.awq_group_size)


@dataclass(frozen=True)
class ServeSettings:
    """The ``[serve]`` table: where ``trtllm-kit serve`` listens and how it starts tritonserver."""

    server: Server = field(default=Server.TRITON, metadata=option(
        "triton: tritonserver over OUT/repo; trtllm-serve: the llmapi artifact's recorded trtllm-serve command "
        "(OpenAI API on --openai-port, else --http-port).", "--server"))
    host: str = field(default=DEFAULT_HOST, metadata=option("Bind address of every endpoint.", "--host"))
    http_port: int = field(default=DEFAULT_HTTP_PORT, metadata=option("Triton HTTP port.", "--http-port",
                                                                      minimum=1))
    grpc_port: int = field(default=DEFAULT_GRPC_PORT, metadata=option("Triton gRPC port.", "--grpc-port",
                                                                      minimum=1))
    metrics_port: int = field(default=DEFAULT_METRICS_PORT, metadata=option(
        "Triton metrics port.", "--metrics-port", minimum=1))
    openai_port: int | None = field(default=None, metadata=option(
        "Also serve the OpenAI API (/v1/...) on this port.", "--openai-port", minimum=1))
    api_keys: Path | None = field(default=None, metadata=option(
        "Require a key from FILE (made by trtllm-kit keys add) on every /v1 route of the OpenAI API, with its "
        "models, rate limits and quota; re-read on SIGHUP.", "--api-keys", metavar="FILE"))
    usage_log: Path | None = field(default=None, metadata=option(
        "Append each request's tokens per key and model to this JSONL file (default: FILE.usage.jsonl beside "
        "--api-keys); quotas are recomputed from it at start.", "--usage-log", metavar="FILE"))
    model: str | None = field(default=None, metadata=option(
        "Public text model: tensorrt_llm_bls or ensemble (default: BLS when the repo has it; it streams in order); "
        "the OpenAI frontend sends text to it only where it cannot tokenize prompts itself.",
        "--model"))
    tritonserver: Path | None = field(default=None, metadata=option(
        "The tritonserver binary or its install dir.", "--tritonserver"))
    ready_timeout_s: float = field(default=DEFAULT_READY_TIMEOUT_S, metadata=option(
        "Seconds to wait for ready.", "--ready-timeout"))
    log_verbose: int = field(default=0, metadata=option("tritonserver --log-verbose level.", "--log-verbose",
                                                        minimum=0))
    verify: bool = field(default=False, metadata=option(
        "Check every file's sha256 against the manifest before starting (default: sizes and times, hashing only "
        "files whose time changed).", "--verify"))
    exit_timeout_s: int = field(default=5, metadata=option(
        "Seconds in-flight requests get to finish on stop (tritonserver --exit-timeout-secs).", "--exit-timeout",
        minimum=1))
    engine_watchdog_s: float = field(default=DEFAULT_ENGINE_WATCHDOG_S, metadata=option(
        "Seconds an engine may hold requests without a step before serve treats it as dead (stops, exits 1).",
        "--engine-watchdog"))
    ensemble: bool = field(default=False, metadata=option(
        "Also load the ensemble model when no served route uses it (it cannot cancel a request whose client "
        "left).", "--ensemble"))
    disagg: bool = field(default=False, metadata=option(
        "Disaggregated prefill/decode for an llmapi OUT: a context server and a generation server behind one "
        "OpenAI frontend doing upstream's two-step request (CPU: two tritonservers, a check of the wiring; with "
        "--server trtllm-serve: two trtllm-serve workers and trtllm-serve disaggregated). Needs --openai-port.",
        "--disagg"))
    kv_transfer_timeout_s: float = field(default=60.0, metadata=option(
        "With --disagg: seconds a context server holds a request's KV blocks for the generation server "
        "(cache_transceiver_config.kv_transfer_timeout_ms).", "--kv-transfer-timeout"))
    context_gpu_device_ids: str | None = field(default=None, metadata=option(
        "With --disagg --server trtllm-serve: the context server's GPUs (e.g. 0,1).", "--context-gpu-device-ids"))
    generation_gpu_device_ids: str | None = field(default=None, metadata=option(
        "With --disagg --server trtllm-serve: the generation server's GPUs (e.g. 2,3).",
        "--generation-gpu-device-ids"))
    dynamo: bool = field(default=False, metadata=option(
        "Serve a cpu or llmapi OUT on NVIDIA Dynamo: the kit's OpenAI frontend (and --api-keys gateway) on "
        "--openai-port in front of Dynamo's frontend (a private loopback port) and --workers of the kit's CPU "
        "workers, file discovery under the run directory. Needs the dynamo extra.", "--dynamo"))
    workers: int = field(default=2, metadata=option(
        "With --dynamo: how many workers serve the model.", "--workers", minimum=1))
    router: Router = field(default=Router.KV, metadata=option(
        "With --dynamo: how the frontend picks a worker (kv: by cached prefix); with --ray: prefix (the replica "
        "that served the prompt's first block) or pow2 (Ray Serve's default; kv reads as prefix).", "--router"))
    migration_limit: int = field(default=3, metadata=option(
        "With --dynamo: how many times a stream moves to another worker when its worker dies (0: never).",
        "--migration-limit", minimum=0))
    ray: bool = field(default=False, metadata=option(
        "Serve a cpu or llmapi OUT as a Ray Serve application on a private Ray (loopback only): the OpenAI frontend "
        "on --openai-port in front of --replicas replicas of the model. Needs the ray extra.", "--ray"))
    replicas: str = field(default="1:2", metadata=option(
        "With --ray: MIN:MAX replicas Ray Serve's autoscaler keeps (MIN 0: scale to zero).", "--replicas"))
    target_ongoing: float = field(default=4.0, metadata=option(
        "With --ray: requests per replica the autoscaler aims at (deploy's --queue-target).", "--target-ongoing"))
    gpu_replicas: bool = field(default=False, metadata=option(
        "With --ray and an llmapi OUT on a machine with GPUs: each replica runs the artifact's trtllm-serve on a "
        "placement group of tp x pp GPUs instead of the CPU runtime.", "--gpu-replicas"))


    def __post_init__(self) -> None:
        check_declared(self, "serve")
        for name in ("http_port", "grpc_port", "metrics_port", "openai_port"):
            port = getattr(self, name)
            if port is not None and port > 65535:
                raise KitUsageError(f"{name} must be a port in 1..65535, got {port}.")
        if self.kv_transfer_timeout_s <= 0:
            raise KitUsageError(f"kv_transfer_timeout_s must be a positive number of seconds, got "
                                f"{self.kv_transfer_timeout_s}.")
        if self.engine_watchdog_s <= 0:
            raise KitUsageError(f"engine_watchdog_s must be a positive number of seconds, got "
                                f"{self.engine_watchdog_s}.")
        if self.ready_timeout_s <= 0:
            raise KitUsageError(f"ready_timeout_s must be a positive number of seconds, got {self.ready_timeout_s}.")

    def endpoint_values(self) -> dict[str, Any]:
        """Host and the three Triton ports, as ``serve.options.Endpoints`` takes them."""
        return {"host": self.host, "http_port": self.http_port, "grpc_port": self.grpc_port,
                "metrics_port": self.metrics_port}
