"""The CLI's commands, one module per area; ``trtllm_kit.cli`` registers them on the group."""
