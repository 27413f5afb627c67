"""API keys on Kubernetes: the gateway's key file from a Secret, its usage log streamed to stdout as JSON lines.

The key file (made by ``trtllm-kit keys add``) lives in the Secret ``api_keys_secret`` under ``KEYS_FILE`` and is
mounted read-only; the frontend re-reads it on SIGHUP. The gateway appends one JSON object per finished request
to its usage log and reads the log back at start to recompute quotas, so the log is a file in an ``emptyDir``
(it survives container restarts); a native sidecar (an init container with ``restartPolicy: Always``, started
before the server and stopped after it) streams that file to its stdout, where the cluster's log pipeline
collects it. On the llmapi target across nodes ``trtllm-serve`` is the OpenAI server, which has no such gateway.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.settings import DeploySettings

Obj = dict[str, Any]
KEYS_DIR = "/etc/trtllm-kit/api-keys"
KEYS_FILE = "keys.json"  # the key in the Secret
USAGE_DIR = "/var/log/trtllm-kit"
USAGE_LOG = f"{USAGE_DIR}/usage.jsonl"
KEYS_PATH = f"{KEYS_DIR}/{KEYS_FILE}"


def serve_args(settings: DeploySettings) -> list[str]:
    """``trtllm-kit serve`` flags for the gateway (none without a key Secret)."""
    if settings.api_keys_secret is None:
        return []
    return ["--api-keys", KEYS_PATH, "--usage-log", USAGE_LOG]


def volumes(settings: DeploySettings) -> list[Obj]:
    """The key Secret and the usage log's ``emptyDir``."""
    if settings.api_keys_secret is None:
        return []
    return [{"name": "api-keys", "secret": {"secretName": settings.api_keys_secret, "defaultMode": 0o440,
                                            "items": [{"key": KEYS_FILE, "path": KEYS_FILE}]}},
            {"name": "usage", "emptyDir": {"sizeLimit": "1Gi"}}]


def mounts(settings: DeploySettings) -> list[Obj]:
    """The server container's mounts of ``volumes``."""
    if settings.api_keys_secret is None:
        return []
    return [{"name": "api-keys", "mountPath": KEYS_DIR, "readOnly": True},
            {"name": "usage", "mountPath": USAGE_DIR}]


def usage_sidecar(settings: DeploySettings, container_security: Obj) -> list[Obj]:
    """The native sidecar printing every usage record to stdout (from the first line, following the file)."""
    if settings.api_keys_secret is None:
        return []
    return [{"name": "usage-log", "image": settings.image, "restartPolicy": "Always",
             "command": ["tail", "-n", "+1", "-F", USAGE_LOG],
             "volumeMounts": [{"name": "usage", "mountPath": USAGE_DIR, "readOnly": True}],
             "securityContext": container_security,
             "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}}]
