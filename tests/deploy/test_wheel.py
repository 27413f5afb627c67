"""`deploy k8s` and `deploy check` from the wheel built from this checkout, installed into a fresh venv in a
temporary directory and run from there: no checkout, no `shared/` beside it, the CRD schemas read from the package.

The venv gets the kit alone (`--no-deps`); its dependencies come from the test interpreter's site-packages as a
plain path entry, so nothing is downloaded and no editable install of a checkout is picked up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from deploy_artifacts import write_artifact
from deploy_helpers import IMAGE

pytestmark = pytest.mark.slow
CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Installed:
    """The fresh venv's ``trtllm-kit`` and the directory it runs in."""

    kit: Path
    home: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRTLLM_KIT_K8S_SCHEMAS")}
        return subprocess.run([str(self.kit), *args], cwd=self.home, env={**env, "HOME": str(self.home)},
                              capture_output=True, text=True, timeout=300)


def _copy_sources(dest: Path) -> None:
    """The checkout's tracked and new files (what a clone holds), so the build writes nothing into the checkout."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=CHECKOUT, capture_output=True,
                            text=True, check=True, timeout=60).stdout.splitlines()
    for name in listed:
        source = CHECKOUT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    sources, wheels, venv, home = root / "src", root / "wheels", root / "venv", root / "home"
    home.mkdir()
    _copy_sources(sources)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(sources)],
                   check=True, capture_output=True, timeout=600)
    wheel = next(wheels.glob("trtllm_kit-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    shutil.rmtree(sources)
    return Installed(venv / "bin" / "trtllm-kit", home)


def test_the_wheel_carries_the_schemas_and_imports_from_the_venv(installed):
    done = subprocess.run([str(installed.kit.parent / "python"), "-c", "import trtllm_kit.deploy.validate as v; "
                           "print(v.__file__); print(v.schema_dir())"], cwd=installed.home, capture_output=True,
                          text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    module, schemas = done.stdout.split()
    assert module.startswith(str(installed.kit.parents[1])) and schemas.startswith(str(installed.kit.parents[1]))
    assert sorted(p.name for p in Path(schemas).glob("*.yaml")) == [
        "gateway.networking.k8s.io_httproutes.yaml", "http.keda.sh_httpscaledobjects.yaml",
        "inference.networking.k8s.io_inferencepools.yaml", "keda.sh_scaledobjects.yaml",
        "leaderworkerset.x-k8s.io_leaderworkersets.yaml", "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml", "monitoring.coreos.com_servicemonitors.yaml",
        "nvidia.com_dynamographdeployments.yaml", "ray.io_rayservices.yaml"]


LAYOUTS = [
    # (artifact, deploy flags, the workload it must write)
    ({"tp": 2}, ("--pvc", "models"), "deployment.yaml"),
    ({"tp": 8}, ("--pvc", "models", "--gpus-per-node", "4"), "leaderworkerset.yaml"),
    ({"tp": 2, "pp": 2}, ("--artifact-url", "https://files.example/a.tar", "--autoscaler", "hpa"), "deployment.yaml"),
    ({"target": "cpu", "tp": 2}, ("--pvc", "models", "--autoscaler", "none"), "deployment.yaml"),
    ({"target": "llmapi", "tp": 2, "quant_algo": "FP8"}, ("--pvc", "models"), "deployment.yaml"),
    ({"target": "llmapi", "tp": 8}, ("--pvc", "models", "--gpus-per-node", "4"), "leaderworkerset.yaml"),
]


@pytest.mark.parametrize(("artifact", "flags", "workload"), LAYOUTS)
def test_deploy_k8s_and_check_from_the_installed_wheel(installed, tmp_path, artifact, flags, workload):
    art = write_artifact(tmp_path / "out", **artifact)
    out = installed.home / f"k8s-{len(list(installed.home.iterdir()))}"
    done = installed.run("deploy", "k8s", str(art), "--out", str(out), "--image", IMAGE, "--json", *flags)
    assert done.returncode == 0, done.stderr
    assert workload in json.loads(done.stdout)["resources"]
    checked = installed.run("deploy", "check", str(out), "--json")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["findings"] == []
    doc = yaml.safe_load((out / "podmonitor.yaml").read_text())
    doc["spec"]["bogus"] = True  # the packaged schemas refuse unknown fields
    (out / "podmonitor.yaml").write_text(yaml.safe_dump(doc))
    broken = installed.run("deploy", "check", str(out))
    assert broken.returncode == 1 and "'bogus' was unexpected" in broken.stderr

