"""The serving image, replaced by this machine's environment.

``deploy try`` cannot pull the image (NVIDIA's Triton container with the kit); each container sees this machine's
file system instead, copy-on-write, with what the image would hold at the image's paths: ``tritonserver`` at
``/opt/tritonserver/bin/tritonserver`` with its Python backend (from the nvidia-pytriton wheel), and ``trtllm-kit``
and ``python3`` of this interpreter first on ``PATH``; the directories on the way to them are made passable for the
container's user in its copy (an interpreter under ``/root`` is not, here).
"""

from __future__ import annotations

import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.deploy.launch import TRITONSERVER
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.server.locate import pytriton_install

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class LocalImage:
    """The image's environment and the links that stand for its files (container path → path here)."""

    env: dict[str, str]
    links: dict[str, str]
    traversable: tuple[str, ...]  # directories the container's users must be able to pass through

    def describe(self) -> str:
        return (f"the image is replaced by this machine's environment: {self.env['PATH'].split(':')[0]} first on "
                f"PATH, {TRITONSERVER} → {self.links[TRITONSERVER]}")


def local_image(cache_dir: Path) -> LocalImage:
    """The stand-in for the serving image.

    Arguments:
        cache_dir: where the Python backend's directory of links is made.
    """
    install = pytriton_install(cache_dir)
    if install is None or install.backend_dir is None:
        raise KitUsageError("deploy try serves with the tritonserver of the nvidia-pytriton wheel, which is not "
                            "installed; pip install 'trtllm-kit[serve-cpu]'.")
    root = Path(TRITONSERVER).parent.parent
    libdir = sysconfig.get_config_var("LIBDIR")
    libraries = [str(p) for p in ([Path(libdir)] if libdir else []) + list(install.lib_dirs)]
    env = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}", "LD_LIBRARY_PATH": ":".join(libraries),
           "HOME": "/tmp", "LANG": "C.UTF-8"}
    links = {TRITONSERVER: str(install.server), str(root / "backends"): str(install.backend_dir)}
    needed = [Path(sys.executable).resolve(), Path(sys.executable), install.server.resolve(), *install.lib_dirs]
    traversable = sorted({str(parent) for path in needed for parent in path.parents if str(parent) != "/"})
    return LocalImage(env, links, tuple(traversable))
