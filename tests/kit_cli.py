"""The ``trtllm-kit`` command as tests run it: the package's own entry point in this interpreter, so a test's
subprocess runs the code under test whatever ``trtllm-kit`` is on the ``PATH``."""

from __future__ import annotations

import sys

KIT = [sys.executable, "-m", "trtllm_kit"]  # ``trtllm-kit ARGS`` is ``[*KIT, *ARGS]``
