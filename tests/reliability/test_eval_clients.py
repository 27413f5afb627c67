"""guidellm (its backend validation on: ``GET /health`` first) and aiperf, the real benchmark clients, against a
served tiny model: every request completes, none errs (``benchmarks/eval_clients.py``, each client from its own
environment under the kit's cache, since neither shares the kit's: guidellm needs numpy 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from eval_clients import CLIENTS, client_bin  # noqa: E402

pytestmark = [
    pytest.mark.integration, pytest.mark.slow,
    pytest.mark.skipif(not all(client_bin(c).exists() for c in CLIENTS),
                       reason="the clients' environments are absent: python benchmarks/eval_clients.py --install-only"),
]


def test_guidellm_and_aiperf_complete_every_request(served: dict[str, Any]) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_clients.py"), "--base-url",
                           f"http://{served['openai']}/v1", "--requests", "12", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = {f["client"]: f for f in json.loads(done.stdout)}
    assert figures == {c: {"client": c, "num_requests": 12, "num_completed": 12, "num_errors": 0} for c in CLIENTS}
