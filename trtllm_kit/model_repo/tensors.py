"""The tensors of the five repository models, as data (``docs/triton-repo.md`` §3.4–§7).

Each row is a ``wire.tensor.Tensor`` ``(name, data type, dims, required)``; dims exclude the Triton batch dimension. The
``tensorrt_llm`` tables are the upstream names and types on both targets, so clients and the ensemble never
know which target they talk to. A tensor the wire reads or writes (``trtllm_kit.wire``) takes its type and dims
from there, and a scalar field's row also places its input in each dialect's order; this module keeps only the
order of the other tensors (config.pbtxt's) and upstream's tensors no kit code reads. Multimodal,
encoder-decoder and speculative-decoding tensors are left out: the kit builds decoder-only text models. The LoRA
inputs (``lora_inputs``) are declared by models that take adapters. ``tensorrt_llm`` also declares the kit's own
optional tensors for what upstream has no tensor for; the C++ backend ignores them, the CPU runtime serves them
(docs/openai-eval-engine.md).
"""

from __future__ import annotations

from trtllm_kit.wire import text, trtllm, trtllm_response
from trtllm_kit.wire.fields import placed
from trtllm_kit.wire.lora import lora_tensors
from trtllm_kit.wire.request import NEVER_END_ID as NEVER_END_ID  # an end_id no token equals
from trtllm_kit.wire.scalars import SCALARS
from trtllm_kit.wire.tensor import Tensor
from trtllm_kit.wire.tensor import by_name as by_name


def _t(name: str, data_type: str, dims: tuple[int, ...] = (1,), required: bool = False) -> Tensor:
    return Tensor(name, data_type, dims, required)


# tensorrt_llm inputs no kit code reads: upstream's, left to the C++ backend or passed on by the ensemble and BLS
UPSTREAM_INPUTS = by_name((
    _t("draft_acceptance_threshold", "FP32"), _t("pad_id", "INT32"), _t("bad_words_list", "INT32", (2, -1)),
    _t("embedding_bias", "FP32", (-1,)), _t("runtime_top_p_min", "FP32"), _t("runtime_top_p_decay", "FP32"),
    _t("runtime_top_p_reset_ids", "INT32"), _t("early_stopping", "BOOL"), _t("beam_search_diversity_rate", "FP32"),
    _t("prompt_embedding_table", "FP16", (-1, -1)), _t("prompt_table_extra_ids", "UINT64", (-1,)),
    _t("prompt_vocab_size", "INT32"),
))
# The order of tensorrt_llm's inputs in config.pbtxt (the golden configs): upstream's, then the kit's additions in
# the wire's order: the wire's tensors no upstream tensorrt_llm input carries, which the C++ backend ignores
# (docs/openai-eval-engine.md). Upstream's inputs a scalar row carries stand where the row places them
# (``trtllm_at``); these are the others, in order. Inputs with a [-1] or wider shape are ragged
# (``allow_ragged_batch``).
UPSTREAM_INPUT_ORDER = placed((
    "input_ids", "input_lengths", "draft_input_ids", "draft_logits", "draft_acceptance_threshold", "pad_id",
    "stop_words_list", "bad_words_list", "embedding_bias", "runtime_top_p_min", "runtime_top_p_decay",
    "runtime_top_p_reset_ids", "early_stopping", "beam_search_diversity_rate", "return_log_probs", "stop",
    "prompt_embedding_table", "prompt_table_extra_ids", "prompt_vocab_size", "guided_decoding_guide_type",
    "guided_decoding_guide",
), "trtllm", SCALARS)
_LORA = {t.name for t in lora_tensors("FP32")}
TRTLLM_INPUT_ORDER = (*UPSTREAM_INPUT_ORDER, *(t.name for t in trtllm.request_tensors()
                                               if t.name not in UPSTREAM_INPUT_ORDER and t.name not in _LORA))
TRTLLM_INPUTS = tuple({**by_name(trtllm.request_tensors()), **UPSTREAM_INPUTS}[name] for name in TRTLLM_INPUT_ORDER)

UPSTREAM_OUTPUTS = by_name((_t("batch_index", "INT32"), _t("first_scheduled_time_ns", "INT64")))  # not produced
TRTLLM_OUTPUT_ORDER = (
    "output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits", "generation_logits",
    "batch_index", "sequence_index", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
    "last_token_time_ns", "num_input_tokens", "num_output_tokens",
)
# The kit's logprob outputs (CPU runtime only; ensemble and BLS do not pass them through): per generated token its
# top alternatives [sequences, tokens, k], per prompt token its logprob [prompt tokens] (the first: 0, it has none)
# and alternatives [prompt tokens, k].
LOGPROB_OUTPUT_ORDER = (
    "top_log_probs", "top_log_prob_ids", "prompt_log_probs", "prompt_top_log_probs", "prompt_top_log_prob_ids")
_OUTPUTS = {**by_name(trtllm_response.RESPONSE_TENSORS), **UPSTREAM_OUTPUTS}
TRTLLM_OUTPUTS = tuple(_OUTPUTS[name] for name in TRTLLM_OUTPUT_ORDER)
LOGPROB_OUTPUTS = tuple(_OUTPUTS[name] for name in LOGPROB_OUTPUT_ORDER)
# The kit's speculative-decoding counts of a sequence (CPU runtime only, when it speculated; the ensemble and BLS do
# not pass them through), after the logprob outputs.
DRAFT_OUTPUTS = tuple(trtllm_response.DRAFT_ACCEPTANCE.values())

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

# The text interface's inputs no kit code writes (upstream's; the ensemble and BLS pass them on), with the
# tensorrt_llm input each feeds (None: only preprocessing reads it).
UPSTREAM_TEXT_INPUTS = {
    "bad_words": (_t("bad_words", "STRING", (-1,)), None), "stop_words": (_t("stop_words", "STRING", (-1,)), None),
    "embedding_bias_words": (_t("embedding_bias_words", "STRING", (-1,)), None),
    "embedding_bias_weights": (_t("embedding_bias_weights", "FP32", (-1,)), None),
    "pad_id": (_t("pad_id", "INT32"), None), "return_log_probs": (_t("return_log_probs", "BOOL"), "return_log_probs"),
    "prompt_embedding_table": (_t("prompt_embedding_table", "FP16", (-1, -1)), "prompt_embedding_table"),
    "prompt_vocab_size": (_t("prompt_vocab_size", "INT32"), "prompt_vocab_size"),
}
# The public text interface of ``ensemble`` and ``tensorrt_llm_bls``, in config.pbtxt's order: the inputs a scalar
# row carries where the row places them (``text_at``), the others in this order.
TEXT_INPUT_ORDER = placed((
    "text_input", "bad_words", "stop_words", "embedding_bias_words", "embedding_bias_weights", "pad_id",
    "return_log_probs", "prompt_embedding_table", "prompt_vocab_size",
), "text", SCALARS)


def _text_inputs() -> tuple[tuple[Tensor, str | None], ...]:
    """(ensemble tensor, tensorrt_llm tensor) per text input: a wire-written one feeds its row's tensorrt_llm input,
    unless preprocessing reads it (``PREPROCESSING_FROM_TEXT``: the prompt, ``max_tokens``, ``end_id``)."""
    wire = by_name(text.request_tensors())
    feeds = {row.tensor("text"): row.tensor("trtllm") for row in SCALARS}
    return tuple(UPSTREAM_TEXT_INPUTS[name] if name not in wire else
                 (wire[name], None if name in PREPROCESSING_FROM_TEXT.values() else feeds[name])
                 for name in TEXT_INPUT_ORDER)


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
TEXT_INPUTS = _text_inputs()  # (ensemble tensor, tensorrt_llm tensor), in TEXT_INPUT_ORDER
TRTLLM_TO_POSTPROCESSING = (("output_ids", "_TOKENS_BATCH", "TOKENS_BATCH"),
                            ("sequence_length", "_SEQUENCE_LENGTH", "SEQUENCE_LENGTH"))

# tensorrt_llm outputs passed through unchanged by ensemble and BLS, next to ``text_output``.
PASSTHROUGH_OUTPUTS = tuple(t for t in TRTLLM_OUTPUTS if t.name not in ("output_ids", "sequence_length"))
TEXT_OUTPUTS = (trtllm_response.TEXT_OUTPUT, *PASSTHROUGH_OUTPUTS)


lora_inputs = lora_tensors  # upstream's LoRA inputs of tensorrt_llm, and of the ensemble and BLS that pass them on
