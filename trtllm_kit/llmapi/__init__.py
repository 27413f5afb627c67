"""Target ``llmapi``: TensorRT-LLM's PyTorch backend. An unsharded unified Hugging Face checkpoint (FP8 in
ModelOpt's format), ``model.yaml`` of LLM API fields, a Triton ``llmapi``-interface Python model and a
``trtllm-serve`` configuration."""
