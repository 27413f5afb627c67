"""The trtllm-build compile: the build plan checked against the GPU, the recipe, and the run that compiles it."""
