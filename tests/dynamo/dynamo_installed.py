"""Whether NVIDIA Dynamo's Python API is installed here, and the mark that skips a real-Dynamo test when not."""

from __future__ import annotations

import importlib.util

import pytest

HAS_DYNAMO = importlib.util.find_spec("dynamo") is not None and importlib.util.find_spec("dynamo.llm") is not None
needs_dynamo = pytest.mark.skipif(not HAS_DYNAMO, reason="NVIDIA Dynamo is not installed (pip install -e '.[dynamo]' "
                                  "and the ai-dynamo wheel with --no-deps, as .ci/run does).")
