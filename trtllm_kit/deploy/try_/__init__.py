"""``trtllm-kit deploy try``: the pods a deploy directory describes, run on this machine the way a kubelet would."""
