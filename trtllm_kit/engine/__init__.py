"""Engine compile: the build plan checked against the GPU, the trtllm-build recipe, and the run that compiles it."""
