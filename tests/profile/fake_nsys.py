#!/usr/bin/env python3
"""A stand-in for ``nsys``: appends its argv (JSON) to $FAKE_NSYS_LOG. ``profile`` runs the application after
the last option it knows and writes ``<-o>.nsys-rep`` when the application ends; ``stats`` copies the sample
CSVs from $FAKE_NSYS_CSV_DIR to ``<--output>_<report>.csv``."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

argv = sys.argv[1:]
with open(os.environ["FAKE_NSYS_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "TLLM_PROFILE_START_STOP": os.environ.get("TLLM_PROFILE_START_STOP")}) + "\n")
if argv[0] == "profile":
    app = argv[argv.index("--trace-fork-before-exec=true") + 1:]
    child = subprocess.Popen(app)
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    Path(argv[argv.index("-o") + 1] + ".nsys-rep").write_bytes(b"fake report")
    sys.exit(0)
if argv[0] == "stats":
    prefix = argv[argv.index("--output") + 1]
    for name in argv[argv.index("--report") + 1].split(","):
        sample = Path(os.environ["FAKE_NSYS_CSV_DIR"]) / f"stats_{name}.csv"
        if sample.is_file():
            shutil.copy(sample, f"{prefix}_{name}.csv")
    sys.exit(0)
sys.exit(2)
