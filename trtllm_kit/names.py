"""Names the build output and its Triton repository use, said once: the repository's models, the output's
directories and the tokenizer's files."""

from __future__ import annotations

# the models of a Triton repository
TRTLLM_MODEL = "tensorrt_llm"  # the in-flight batching slot: engines, the CPU runtime or an llmapi LLM
PREPROCESSING_MODEL = "preprocessing"
POSTPROCESSING_MODEL = "postprocessing"
ENSEMBLE_MODEL = "ensemble"
BLS_MODEL = "tensorrt_llm_bls"
DRAFT_MODEL = "tensorrt_llm_draft"  # draft-target speculation: the draft engine's in-flight batching model
MODEL_NAMES = (PREPROCESSING_MODEL, TRTLLM_MODEL, POSTPROCESSING_MODEL, ENSEMBLE_MODEL, BLS_MODEL)
LLM_ARGS_FILE = "1/model.yaml"  # the llmapi model's LLM() arguments, inside its model directory

# the directories of a build output
CHECKPOINT_DIR = "checkpoint"
ENGINE_DIR = "engines"
DRAFT_CHECKPOINT_DIR = "draft_checkpoint"  # draft-target on the engine target: the draft's TensorRT-LLM checkpoint
DRAFT_ENGINE_DIR = "draft_engines"  # and its engine
DRAFT_DIR = "draft"  # draft-target and EAGLE3 on the llmapi target: the draft (or heads) checkpoint, copied
TOKENIZER_DIR = "tokenizer"  # also inside each repository model that tokenizes
LORA_DIR = "lora"  # the LoRA adapters added to the artifact, one directory each
SERVE_DIR = "trtllm-serve"  # the llmapi target's trtllm-serve configuration

# what a build copies of a model's tokenizer (with the settings and chat templates around it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json",
                   "chat_template.jinja", "chat_template.json")
# any one of these makes a directory hold a tokenizer (``generation_config.json`` alone does not)
TOKENIZER_CORE_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

# the environment variable that carries an OpenAI API key to `serve` and the load generators (never argv)
API_KEY_ENV = "TRTLLM_KIT_API_KEY"
