"""A pod's volumes as directories on this machine: ``emptyDir`` (a fresh directory, group-owned by the pod's
``fsGroup``), ``configMap`` and ``secret`` (their keys as files, with the volume's modes), and a
``persistentVolumeClaim`` from the directory given for it (``--pvc-dir NAME=PATH``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtllm_kit.deploy.try_.cluster import Cluster
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]


def _write_items(directory: Path, data: dict[str, bytes], volume: Obj, group: int | None) -> None:
    """The keys of a ConfigMap or Secret volume (or its ``items``) as files with its ``defaultMode``/``mode``."""
    default = int(volume.get("defaultMode", 0o644))
    items = volume.get("items") or [{"key": key, "path": key} for key in data]
    directory.mkdir(parents=True)
    for item in items:
        if item["key"] not in data:
            raise KitUsageError(f"volume item {item['key']!r} is not in its ConfigMap or Secret (keys: "
                                f"{', '.join(sorted(data)) or 'none'}); fix the volume's items.")
        path = directory / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[item["key"]])
        os.chown(path, 0, group if group is not None else 0)
        path.chmod(int(item.get("mode", default)))
    os.chown(directory, 0, group if group is not None else 0)
    directory.chmod(0o755)


def pod_volumes(spec: Obj, cluster: Cluster, pod_dir: Path, pvc_dirs: dict[str, Path]) -> dict[str, Path]:
    """Volume name → the directory that backs it, for one pod.

    Arguments:
        spec: the pod spec; cluster: its ConfigMaps and Secrets; pod_dir: where the pod's own directories go;
        pvc_dirs: claim name → the directory standing for it.
    """
    group = (spec.get("securityContext") or {}).get("fsGroup")
    found = {}
    for volume in spec.get("volumes") or []:
        name = volume["name"]
        directory = pod_dir / "volumes" / name
        if "emptyDir" in volume:
            directory.mkdir(parents=True)
            os.chown(directory, 0, group if group is not None else 0)
            directory.chmod(0o2777 if group is None else 0o2775)
        elif "configMap" in volume:
            source = volume["configMap"]["name"]
            if source not in cluster.config_maps:
                raise KitUsageError(f"volume {name} names ConfigMap {source}, which the directory does not hold.")
            _write_items(directory, cluster.config_maps[source], volume["configMap"], group)
        elif "secret" in volume:
            source = volume["secret"]["secretName"]
            if source not in cluster.secrets:
                raise KitUsageError(f"volume {name} names Secret {source}, which the directory does not hold or "
                                    "generate; create it in the directory (kustomize secretGenerator) to try it.")
            _write_items(directory, cluster.secrets[source], volume["secret"], group)
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in pvc_dirs:
                raise KitUsageError(f"volume {name} is the PersistentVolumeClaim {claim}; give the directory that "
                                    f"stands for it with --pvc-dir {claim}=PATH.")
            directory = pvc_dirs[claim]
        else:
            raise KitUsageError(f"volume {name} is of a kind deploy try does not provide ({', '.join(volume)}); it "
                                "provides emptyDir, configMap, secret and persistentVolumeClaim.")
        found[name] = directory
    return found
