"""trtllm-kit: a Hugging Face checkpoint to a served, measured TensorRT-LLM model."""

__version__ = "0.1.0"
