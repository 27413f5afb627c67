"""Defaults more than one stage relies on, stated once. The spec's fields declare them (``BuildOptions``,
``ServeSettings``); the planner, the CPU runtime, the repository and the launcher import them from here."""

DEFAULT_TOKENS_PER_BLOCK = 32  # paged KV block size: the build, the plan, the CPU runtime, engines that omit it
DEFAULT_KV_CACHE_FRACTION = 0.9  # the backend's kv_cache_free_gpu_mem_fraction, and the plan's KV share
DEFAULT_HOST = "127.0.0.1"  # safe by default: every endpoint binds loopback unless told otherwise
DEFAULT_HTTP_PORT = 8000  # tritonserver's own defaults
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
DEFAULT_READY_TIMEOUT_S = 300.0
DEFAULT_ENGINE_WATCHDOG_S = 15.0  # an engine holding requests without a step for this long is treated as dead
DEFAULT_MAX_LORA_RANK = 64  # the highest adapter rank an artifact takes (trtllm-build --max_lora_rank's default)
# the backend's LoRA cache defaults (tensorrtllm_backend docs/lora.md): host bytes, share of GPU memory left after
# the engine and the KV cache, and the rank that fills one cache page
DEFAULT_LORA_CACHE_HOST_MEMORY_BYTES = 1 << 30
DEFAULT_LORA_CACHE_GPU_MEMORY_FRACTION = 0.05
DEFAULT_LORA_CACHE_OPTIMAL_ADAPTER_SIZE = 8
DEFAULT_MAX_LORAS = 4  # adapters a LoRA cache holds at once (LoraConfig.max_loras's 1.x default)
