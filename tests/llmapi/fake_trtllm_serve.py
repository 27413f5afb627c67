"""A fake ``trtllm-serve`` (it needs a GPU) on PATH, recording every start: its argv and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Appends {"argv", "gpus"} (CUDA_VISIBLE_DEVICES) to $FAKE_CALLS and answers /health where it was told to listen:
# --host/--port for a worker, the config file's hostname/port for ``trtllm-serve disaggregated -c FILE``.
FAKE_TRTLLM_SERVE = '''#!{python}
import http.server, json, os, signal, sys, yaml
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\\n")
if sys.argv[1] == "disaggregated":
    config = yaml.safe_load(open(sys.argv[sys.argv.index("-c") + 1]))
    host, port = config["hostname"], config["port"]
else:
    host, port = sys.argv[sys.argv.index("--host") + 1], int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer((host, port), Health)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
server.serve_forever()
'''


@dataclass(frozen=True)
class TrtllmServePath:
    """An environment whose PATH has the fake ``trtllm-serve`` (or none at all), and the calls the fake recorded."""

    env: dict[str, str]
    calls_file: Path

    def calls(self) -> list[dict[str, Any]]:
        """Each start of the fake: its argv (after the program) and CUDA_VISIBLE_DEVICES (None when unset)."""
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]


def trtllm_serve_path(bin_dir: Path, *, with_fake: bool) -> TrtllmServePath:
    """PATH with ``bin_dir`` first, holding the fake when ``with_fake``, and without any other trtllm-serve."""
    bin_dir.mkdir()
    if with_fake:
        fake = bin_dir / "trtllm-serve"
        fake.write_text(FAKE_TRTLLM_SERVE.format(python=sys.executable))
        fake.chmod(0o755)
    path = [str(bin_dir)] + [p for p in os.environ["PATH"].split(os.pathsep)
                             if not (Path(p) / "trtllm-serve").exists()]
    calls_file = bin_dir.parent / "trtllm-serve.calls.jsonl"
    return TrtllmServePath({**os.environ, "PATH": os.pathsep.join(path), "FAKE_CALLS": str(calls_file)}, calls_file)
