"""Whether a server answers on a URL: the one readiness probe every process the kit waits for is asked with.

A port seen free can be taken by another process (often another server's gRPC port, which answers in HTTP/2 frames)
before the server being waited for binds it; what answers there is not HTTP, and the probe reads that as not ready,
never as an error of its own. The waiting loop then sees the server exit with its own bind error."""

from __future__ import annotations

import http.client
import urllib.request


def answers(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``GET url`` answers 200 now (a fresh connection each time: no keep-alive to hold a shutdown).

    Arguments:
        url: ``http://host:port/path``; timeout_s: seconds to connect and read.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (OSError, http.client.HTTPException):  # URLError and timeouts are OSErrors; a non-HTTP answer is neither
        return False
