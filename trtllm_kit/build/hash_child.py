"""``python -m trtllm_kit.build.hash_child PARENT_PID FILE...``: the sha256 of each file, printed as one JSON line
per file as soon as it is done (``{"name", "fingerprint": [size, mtime_ns], "sha256"}``); a file that cannot be read
is left out. ``BackgroundDigests`` runs it while the build loads torch: in a process of its own the hashing never
waits for the interpreter lock that the imports hold. It stops when its parent is gone (``PARENT_PID`` is given so
that a parent gone before the child has started is seen too).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

CHUNK = 16 * 1024 * 1024  # bytes per read


def main(parent: int, paths: list[str]) -> None:
    for path in paths:
        try:
            stat, digest = os.stat(path), hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(CHUNK):
                    if os.getppid() != parent:  # the build was killed: nobody reads the result
                        return
                    digest.update(block)
        except OSError:
            continue
        print(json.dumps({"name": os.path.basename(path), "fingerprint": [stat.st_size, stat.st_mtime_ns],
                          "sha256": digest.hexdigest()}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
