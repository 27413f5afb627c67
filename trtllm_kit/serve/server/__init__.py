"""The server room: start, readiness and stop of tritonserver and trtllm-serve, the reaper, the run directory."""
