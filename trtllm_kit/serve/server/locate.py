"""Find a ``tritonserver`` binary and the backend directory, libraries and environment it needs."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.server.state import kit_cache

OPT_TRITONSERVER = Path("/opt/tritonserver")
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstall:
    """A usable ``tritonserver``: the binary, its backend directory and what its environment must hold."""

    server: Path
    source: str
    backend_dir: Path | None = None
    lib_dirs: tuple[Path, ...] = field(default_factory=tuple)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The server's environment: this interpreter's libpython and bin directory first.

        The Python-backend stub links ``libpython3.X.so`` through the loader search path and finds its
        ``sys.prefix`` (and so its site-packages) from the first ``python3`` on ``PATH``: both must be the
        interpreter running the kit, or models fail to import inside the stub.

        Arguments:
            base: the environment to extend (``os.environ`` when omitted).
        """
        env = dict(os.environ if base is None else base)
        libdir = sysconfig.get_config_var("LIBDIR")
        first = [str(p) for p in ([Path(libdir)] if libdir else []) + list(self.lib_dirs)]
        env["LD_LIBRARY_PATH"] = _prepend(first, env.get("LD_LIBRARY_PATH", ""))
        env["PATH"] = _prepend([str(Path(sys.executable).parent)], env.get("PATH", ""))
        return env


def _prepend(entries: list[str], current: str) -> str:
    rest = [p for p in current.split(os.pathsep) if p and p not in entries]
    return os.pathsep.join(entries + rest)


def locate_tritonserver(explicit: Path | None = None, *, search_path: str | None = None,
                        opt_dir: Path = OPT_TRITONSERVER, cache_dir: Path | None = None) -> TritonInstall:
    """Find ``tritonserver``: ``explicit``, then ``PATH``, then ``opt_dir``, then the nvidia-pytriton wheel.

    Arguments:
        explicit: the ``--tritonserver`` path the user gave (a binary or an installation directory).
        search_path: the ``PATH`` to search (``$PATH`` when omitted).
        opt_dir: the NGC containers' installation directory.
        cache_dir: where the wheel's backend directory of symlinks is made (the kit cache when omitted).
    """
    if explicit is not None:
        binary = explicit / "bin" / "tritonserver" if explicit.is_dir() else explicit
        if not _is_executable(binary):
            raise KitUsageError(f"--tritonserver {explicit} is not an executable tritonserver; pass the binary "
                                "or its installation directory (e.g. /opt/tritonserver).")
        return _install_at(binary, "--tritonserver")
    path = os.environ.get("PATH", "") if search_path is None else search_path
    found = shutil.which("tritonserver", path=path)
    if found:
        return _install_at(Path(found), "PATH")
    if _is_executable(opt_dir / "bin" / "tritonserver"):
        return _install_at(opt_dir / "bin" / "tritonserver", str(opt_dir))
    wheel = pytriton_install(cache_dir)
    if wheel is not None:
        return wheel
    raise KitUsageError(f"no tritonserver found: searched --tritonserver (not given), PATH ({path or 'empty'}), "
                        f"{opt_dir}/bin/tritonserver and the nvidia-pytriton wheel (not installed for "
                        f"{sys.executable}); run inside NVIDIA's Triton container, pip install "
                        "'trtllm-kit[serve-cpu]', or pass --tritonserver PATH.")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _install_at(binary: Path, source: str) -> TritonInstall:
    """An installation laid out as ``<root>/bin/tritonserver`` with ``<root>/backends`` (the container layout)."""
    backends = binary.parent.parent / "backends"
    return TritonInstall(server=binary, source=source, backend_dir=backends if backends.is_dir() else None)


def pytriton_install(cache_dir: Path | None = None) -> TritonInstall | None:
    """The server bundled in the nvidia-pytriton wheel, or None when the wheel (or its server) is absent.

    The wheel ships the Python-backend stubs apart from the backend (``python_backend_stubs/3.X``), so a
    backend directory of symlinks holding the stub of the running Python is made under the kit cache.

    Arguments:
        cache_dir: the directory for the backend symlinks (the kit cache when omitted).
    """
    spec = util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).parent
    root = package / "tritonserver"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {name: root / "backends" / "python" / name for name in PYTHON_BACKEND_FILES}
    sources[STUB] = root / "python_backend_stubs" / python / STUB
    if not _is_executable(root / "bin" / "tritonserver") or not all(p.exists() for p in sources.values()):
        return None
    if cache_dir is None:
        cache_dir = kit_cache()
    backends = cache_dir / "tritonserver" / f"pytriton-{metadata.version('nvidia-pytriton')}-py{python}" / "backends"
    _link_all(backends / "python", sources)
    return TritonInstall(server=root / "bin" / "tritonserver", source="nvidia-pytriton", backend_dir=backends,
                         lib_dirs=(package.parent / "nvidia_pytriton.libs",))


def _link_all(directory: Path, sources: dict[str, Path]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        link = directory / name
        if link.is_symlink() and link.readlink() == source:
            continue
        tmp = directory / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(source)
        tmp.replace(link)
