"""``trtllm-kit serve OUT --disagg``: a context server and a generation server started, made ready and stopped as
one service (``cpu.py``: two tritonservers behind the kit's frontend; ``trtllm_serve.py``: upstream's workers and
orchestrator)."""
