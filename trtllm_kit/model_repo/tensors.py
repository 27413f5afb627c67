"""The tensors of the five repository models, as data (``docs/triton-repo.md`` §3.4–§7).

Each row is a ``wire.tensor.Tensor`` ``(name, data type, dims, required)``; dims exclude the Triton batch dimension. The
``tensorrt_llm`` tables are the upstream names and types on both targets, so clients and the ensemble never
know which target they talk to. Multimodal, encoder-decoder and speculative-decoding tensors are left out: the kit
builds decoder-only text models. The LoRA inputs (``lora_inputs``) are declared by models that take adapters.
``tensorrt_llm`` also declares the kit's own optional tensors for what upstream has no tensor for
(``runtime_min_p``, top logprob alternatives, prompt logprobs, keeping the end token); the C++ backend ignores them,
the CPU runtime serves them (docs/openai-eval-engine.md).
"""

from __future__ import annotations

from trtllm_kit.wire.lora import lora_tensors
from trtllm_kit.wire.request import NEVER_END_ID as NEVER_END_ID  # an end_id no token equals
from trtllm_kit.wire.tensor import Tensor
from trtllm_kit.wire.tensor import by_name as by_name


def _t(name: str, data_type: str, dims: tuple[int, ...] = (1,), required: bool = False) -> Tensor:
    return Tensor(name, data_type, dims, required)


# Inputs of ``tensorrt_llm`` with a [-1] or wider shape are ragged (``allow_ragged_batch``).
TRTLLM_INPUTS = (
    _t("input_ids", "INT32", (-1,), True),
    _t("input_lengths", "INT32", (1,), True),
    _t("request_output_len", "INT32", (1,), True),
    _t("num_return_sequences", "INT32"),
    _t("draft_input_ids", "INT32", (-1,)),
    _t("draft_logits", "FP32", (-1, -1)),
    _t("draft_acceptance_threshold", "FP32"),
    _t("end_id", "INT32"),
    _t("pad_id", "INT32"),
    _t("stop_words_list", "INT32", (2, -1)),
    _t("bad_words_list", "INT32", (2, -1)),
    _t("embedding_bias", "FP32", (-1,)),
    _t("beam_width", "INT32"),
    _t("temperature", "FP32"),
    _t("runtime_top_k", "INT32"),
    _t("runtime_top_p", "FP32"),
    _t("runtime_top_p_min", "FP32"),
    _t("runtime_top_p_decay", "FP32"),
    _t("runtime_top_p_reset_ids", "INT32"),
    _t("len_penalty", "FP32"),
    _t("early_stopping", "BOOL"),
    _t("repetition_penalty", "FP32"),
    _t("min_tokens", "INT32"),
    _t("beam_search_diversity_rate", "FP32"),
    _t("presence_penalty", "FP32"),
    _t("frequency_penalty", "FP32"),
    _t("seed", "UINT64"),
    _t("return_log_probs", "BOOL"),
    _t("return_context_logits", "BOOL"),
    _t("return_generation_logits", "BOOL"),
    _t("return_perf_metrics", "BOOL"),
    _t("return_num_input_tokens", "BOOL"),
    _t("return_num_output_tokens", "BOOL"),
    _t("exclude_input_in_output", "BOOL"),
    _t("stop", "BOOL"),
    _t("streaming", "BOOL"),
    _t("prompt_embedding_table", "FP16", (-1, -1)),
    _t("prompt_table_extra_ids", "UINT64", (-1,)),
    _t("prompt_vocab_size", "INT32"),
    _t("guided_decoding_guide_type", "STRING"),
    _t("guided_decoding_guide", "STRING"),
    # The kit's additions (no upstream tensorrt_llm input carries them; the C++ backend ignores them):
    # the request priority in [0, 1], higher first, as TensorRT-LLM's executor Request takes it;
    _t("priority", "FP32"),
    # vLLM's min_p (0 = off); the top alternatives per token (0 to 20) in ``top_log_probs`` /
    # ``prompt_top_log_probs``; and the prompt tokens' logprobs (``prompt_log_probs``).
    _t("runtime_min_p", "FP32"),
    _t("num_top_log_probs", "INT32"),
    _t("return_prompt_log_probs", "BOOL"),
    # the token that ends the sequence (``end_id``) kept as its last output token, with its logprob, as vLLM and
    # OpenAI answer (upstream's executor leaves it out, and so does the C++ backend, which ignores this input).
    _t("keep_end_token", "BOOL"),
)

TRTLLM_OUTPUTS = (
    _t("output_ids", "INT32", (-1, -1)),
    _t("sequence_length", "INT32", (-1,)),
    _t("cum_log_probs", "FP32", (-1,)),
    _t("output_log_probs", "FP32", (-1, -1)),
    _t("context_logits", "FP32", (-1, -1)),
    _t("generation_logits", "FP32", (-1, -1, -1)),
    _t("batch_index", "INT32"),
    _t("sequence_index", "INT32"),
    _t("kv_cache_alloc_new_blocks", "INT32"),
    _t("kv_cache_reused_blocks", "INT32"),
    _t("kv_cache_alloc_total_blocks", "INT32"),
    _t("arrival_time_ns", "INT64"),
    _t("first_scheduled_time_ns", "INT64"),
    _t("first_token_time_ns", "INT64"),
    _t("last_token_time_ns", "INT64"),
    _t("num_input_tokens", "INT32"),
    _t("num_output_tokens", "INT32"),
)
# The kit's logprob outputs (CPU runtime only; ensemble and BLS do not pass them through): per generated token its
# top alternatives [sequences, tokens, k], per prompt token its logprob [prompt tokens] (the first: 0, it has none)
# and alternatives [prompt tokens, k].
LOGPROB_OUTPUTS = (
    _t("top_log_probs", "FP32", (-1, -1, -1)),
    _t("top_log_prob_ids", "INT32", (-1, -1, -1)),
    _t("prompt_log_probs", "FP32", (-1,)),
    _t("prompt_top_log_probs", "FP32", (-1, -1)),
    _t("prompt_top_log_prob_ids", "INT32", (-1, -1)),
)

PREPROCESSING_INPUTS = (
    _t("QUERY", "STRING", (1,), True),
    _t("REQUEST_OUTPUT_LEN", "INT32", (1,), True),
    _t("BAD_WORDS_DICT", "STRING", (-1,)),
    _t("STOP_WORDS_DICT", "STRING", (-1,)),
    _t("EMBEDDING_BIAS_WORDS", "STRING", (-1,)),
    _t("EMBEDDING_BIAS_WEIGHTS", "FP32", (-1,)),
    _t("END_ID", "INT32"),
    _t("PAD_ID", "INT32"),
)

PREPROCESSING_OUTPUTS = (
    _t("INPUT_ID", "INT32", (-1,)),
    _t("REQUEST_INPUT_LEN", "INT32"),
    _t("BAD_WORDS_IDS", "INT32", (2, -1)),
    _t("STOP_WORDS_IDS", "INT32", (2, -1)),
    _t("EMBEDDING_BIAS", "FP32", (-1,)),
    _t("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
    _t("OUT_END_ID", "INT32"),
    _t("OUT_PAD_ID", "INT32"),
)

POSTPROCESSING_INPUTS = (
    _t("TOKENS_BATCH", "INT32", (-1, -1), True),
    _t("SEQUENCE_LENGTH", "INT32", (-1,), True),
)

POSTPROCESSING_OUTPUTS = (_t("OUTPUT", "STRING", (-1,)),)

# The public text interface of ``ensemble`` and ``tensorrt_llm_bls``: (ensemble tensor, tensorrt_llm tensor).
# The first two go through preprocessing; ``None`` marks inputs that only preprocessing reads.
TEXT_INPUTS = (
    (_t("text_input", "STRING", (1,), True), None),
    (_t("max_tokens", "INT32", (1,), True), None),
    (_t("bad_words", "STRING", (-1,)), None),
    (_t("stop_words", "STRING", (-1,)), None),
    (_t("embedding_bias_words", "STRING", (-1,)), None),
    (_t("embedding_bias_weights", "FP32", (-1,)), None),
    (_t("end_id", "INT32"), None),
    (_t("pad_id", "INT32"), None),
    (_t("top_k", "INT32"), "runtime_top_k"),
    (_t("top_p", "FP32"), "runtime_top_p"),
    (_t("temperature", "FP32"), "temperature"),
    (_t("length_penalty", "FP32"), "len_penalty"),
    (_t("repetition_penalty", "FP32"), "repetition_penalty"),
    (_t("min_tokens", "INT32"), "min_tokens"),
    (_t("presence_penalty", "FP32"), "presence_penalty"),
    (_t("frequency_penalty", "FP32"), "frequency_penalty"),
    (_t("seed", "UINT64"), "seed"),
    (_t("return_log_probs", "BOOL"), "return_log_probs"),
    (_t("return_context_logits", "BOOL"), "return_context_logits"),
    (_t("return_generation_logits", "BOOL"), "return_generation_logits"),
    (_t("return_perf_metrics", "BOOL"), "return_perf_metrics"),
    (_t("return_num_input_tokens", "BOOL"), "return_num_input_tokens"),
    (_t("return_num_output_tokens", "BOOL"), "return_num_output_tokens"),
    (_t("exclude_input_in_output", "BOOL"), "exclude_input_in_output"),
    (_t("beam_width", "INT32"), "beam_width"),
    (_t("num_return_sequences", "INT32"), "num_return_sequences"),
    (_t("stream", "BOOL"), "streaming"),
    (_t("prompt_embedding_table", "FP16", (-1, -1)), "prompt_embedding_table"),
    (_t("prompt_vocab_size", "INT32"), "prompt_vocab_size"),
    (_t("priority", "FP32"), "priority"),
)

# Preprocessing's inputs fed from the text interface, and its outputs fed to tensorrt_llm (via internal names).
PREPROCESSING_FROM_TEXT = {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "BAD_WORDS_DICT": "bad_words",
                           "STOP_WORDS_DICT": "stop_words", "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
                           "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights", "END_ID": "end_id",
                           "PAD_ID": "pad_id"}
PREPROCESSING_TO_TRTLLM = (  # (preprocessing output, internal ensemble tensor, tensorrt_llm input)
    ("INPUT_ID", "_INPUT_ID", "input_ids"),
    ("REQUEST_INPUT_LEN", "_REQUEST_INPUT_LEN", "input_lengths"),
    ("REQUEST_OUTPUT_LEN", "_REQUEST_OUTPUT_LEN", "request_output_len"),
    ("STOP_WORDS_IDS", "_STOP_WORDS_IDS", "stop_words_list"),
    ("BAD_WORDS_IDS", "_BAD_WORDS_IDS", "bad_words_list"),
    ("EMBEDDING_BIAS", "_EMBEDDING_BIAS", "embedding_bias"),
    ("OUT_END_ID", "_PREPROCESSOR_END_ID", "end_id"),
    ("OUT_PAD_ID", "_PREPROCESSOR_PAD_ID", "pad_id"),
)
TRTLLM_TO_POSTPROCESSING = (("output_ids", "_TOKENS_BATCH", "TOKENS_BATCH"),
                            ("sequence_length", "_SEQUENCE_LENGTH", "SEQUENCE_LENGTH"))

# tensorrt_llm outputs passed through unchanged by ensemble and BLS, next to ``text_output``.
PASSTHROUGH_OUTPUTS = tuple(t for t in TRTLLM_OUTPUTS if t.name not in ("output_ids", "sequence_length"))
TEXT_OUTPUTS = (_t("text_output", "STRING", (-1,)), *PASSTHROUGH_OUTPUTS)


lora_inputs = lora_tensors  # upstream's LoRA inputs of tensorrt_llm, and of the ensemble and BLS that pass them on
