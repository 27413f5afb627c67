"""Checkpoint conversion: a Hugging Face checkpoint read, sharded, quantized and written for TensorRT-LLM."""
