"""Offline validation of a deploy directory: core kinds by ``kubernetes-validate`` (strict, one Kubernetes
version), custom resources by their saved CRD schemas with unknown fields rejected, and the kit's own lints."""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.errors import KitError, KitUsageError

KUBERNETES_VERSION = "1.33"
CRD_FILES = ("keda.sh_scaledobjects.yaml", "http.keda.sh_httpscaledobjects.yaml",
             "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
             "monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_servicemonitors.yaml",
             "monitoring.coreos.com_prometheusrules.yaml", "nvidia.com_dynamographdeployments.yaml",
             "inference.networking.k8s.io_inferencepools.yaml", "gateway.networking.k8s.io_httproutes.yaml",
             "ray.io_rayservices.yaml")
CUSTOM_GROUPS = tuple(dict.fromkeys(name.partition("_")[0] for name in CRD_FILES))  # a CRD file is GROUP_PLURAL.yaml
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the Dynamo CRD is 1.6 MB: libyaml reads it in a blink
SCHEMAS_ENV = "TRTLLM_KIT_K8S_SCHEMAS"


@dataclass(frozen=True)
class Finding:
    """One problem: the file and object it is in, where, and what."""

    file: str
    kind: str
    name: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"{self.file}: {self.kind} {self.name}{where}: {self.message}"


def schema_dir() -> Path:
    """The saved CRD schemas: the package's ``deploy/schemas`` (see its README for their upstream source), or the
    directory ``TRTLLM_KIT_K8S_SCHEMAS`` names (same file names) to validate against other CRD versions."""
    given = os.environ.get(SCHEMAS_ENV)
    if given:
        return Path(given)
    return Path(str(resources.files("trtllm_kit.deploy") / "schemas"))


def _closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever it lists properties and allows nothing else."""
    if isinstance(schema, dict):
        schema = {key: _closed(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


@functools.cache
def crd_schemas(directory: Path, group: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, version, kind) → the closed ``openAPIV3Schema`` of every saved CRD of ``group``, read once: a
    directory without LeaderWorkerSets, Dynamo graphs or RayServices never parses their megabytes of schema.

    Arguments:
        directory: where the CRD YAML files are; group: the API group, e.g. ``keda.sh``.
    """
    found = {}
    for name in CRD_FILES:
        if name.partition("_")[0] != group:
            continue
        path = directory / name
        if not path.is_file():
            where = f"{SCHEMAS_ENV} names {directory}" if os.environ.get(SCHEMAS_ENV) else \
                "the installed package lacks it"
            raise KitUsageError(f"the CRD schema {path} is missing ({where}); unset {SCHEMAS_ENV} or point it at a "
                                f"directory holding {', '.join(CRD_FILES)}, or reinstall trtllm-kit.")
        crd = yaml.load(path.read_text(), Loader=YAML_LOADER)
        for version in crd["spec"]["versions"]:
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            found[(crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"])] = _closed(schema)
    return found


def check_object(doc: dict[str, Any], file: str, version: str = KUBERNETES_VERSION) -> list[Finding]:
    """Every schema problem of one object.

    Arguments:
        doc: the object; file: its file name (for messages); version: the Kubernetes version of core schemas.
    """
    try:
        import jsonschema
        import kubernetes_validate
    except ImportError as exc:
        raise KitError(f"offline validation needs {exc.name}, which is not installed; install the deploy extra "
                       "(pip install 'trtllm-kit[deploy]').") from None

    kind, name = str(doc.get("kind")), str((doc.get("metadata") or {}).get("name"))
    group, _, api_version = str(doc.get("apiVersion")).rpartition("/")
    if group in CUSTOM_GROUPS:
        schema = crd_schemas(schema_dir(), group).get((group, api_version, kind))
        if schema is None:
            return [Finding(file, kind, name, "", f"no saved schema for {doc.get('apiVersion')} {kind}")]
        validator = jsonschema.Draft202012Validator(schema)
        return [Finding(file, kind, name, "/".join(str(p) for p in error.absolute_path), error.message)
                for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [Finding(file, kind, name, "/".join(str(p) for p in exc.path), exc.message)]
    except kubernetes_validate.SchemaNotFoundError:
        return [Finding(file, kind, name, "", f"Kubernetes {version} has no {doc.get('apiVersion')} {kind}")]
    return []


def load_dir(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) of every object in the directory's ``kustomization.yaml`` resources.

    Arguments:
        directory: a ``trtllm-kit deploy k8s`` output.
    """
    kustomization = directory / "kustomization.yaml"
    if not kustomization.is_file():
        raise KitUsageError(f"{directory} has no kustomization.yaml; pass a trtllm-kit deploy k8s output.")
    docs = []
    for name in yaml.safe_load(kustomization.read_text()).get("resources") or []:
        path = directory / name
        if not path.is_file():
            raise KitUsageError(f"{kustomization} lists {name}, which is missing; restore it or remove it from "
                                "resources.")
        try:
            docs += [(name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        except yaml.YAMLError as exc:
            raise KitUsageError(f"{path} is not valid YAML ({exc}); fix it.") from None
    return docs
