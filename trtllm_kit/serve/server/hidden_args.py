"""Secret arguments that a child reads in its ``argv`` but ``/proc/PID/cmdline`` does not show.

tritonserver takes its restriction token only as a command-line option (``getopt_long`` over ``argv``; it has
no option file and reads no option from its environment), and any local user reads ``/proc/PID/cmdline``. So:

- the child is started with each secret argument masked, and the real argument in its environment
  (``/proc/PID/environ`` is readable by its owner and root only);
- it stops at its ``exec`` (``PTRACE_TRACEME``), before its ``main`` runs;
- this process points the masked entries of the child's ``argv`` array at the real arguments in the child's
  environment block (through ``/proc/PID/mem``), and lets it run.

``/proc/PID/cmdline`` shows the memory between the kernel's ``arg_start`` and ``arg_end``, which still holds the
masked strings; the child's ``main`` reads the real ones. Any failure kills the stopped child, so it never runs
with a masked argument.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.errors import KitError

PTRACE_TRACEME = 0
PTRACE_DETACH = 17
ENV_PREFIX = "TRTLLM_KIT_HIDDEN_ARG_"
MASK = "<hidden>"
POINTER = struct.Struct("<Q")  # x86_64 and aarch64: 64-bit little-endian pointers
STACK_SEARCH_BYTES = 256 * 1024  # the argv array lies below the strings, past auxv and the random bytes


@dataclass(frozen=True)
class HiddenArgs:
    """``argv`` with the ``secret`` substring of every argument masked, and the environment that carries them.

    Arguments:
        argv: the real command line; secret: the text that must not appear in ``/proc/PID/cmdline``.
    """

    argv: list[str]
    secret: str

    @property
    def hidden(self) -> dict[int, str]:
        """The arguments that hold the secret, by position."""
        return {i: arg for i, arg in enumerate(self.argv) if self.secret in arg}

    def shown(self) -> list[str]:
        """The command line the child is started with (and ``ps`` shows)."""
        return [arg.replace(self.secret, MASK) if i in self.hidden else arg for i, arg in enumerate(self.argv)]

    def environment(self) -> dict[str, str]:
        """The variables that carry the real arguments into the child's environment block."""
        return {f"{ENV_PREFIX}{i}": arg for i, arg in self.hidden.items()}

    def reveal(self, pid: int) -> None:
        """Point the stopped child's masked ``argv`` entries at the real arguments, then let it run.

        Call from the thread that started the child (its tracer), right after the start. Raises ``KitError``
        (the child killed) when the child did not stop at its exec or its memory is not as expected.
        """
        try:
            _, status = os.waitpid(pid, 0)
            if not (os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP):
                raise KitError(f"the server (pid {pid}) did not stop at its start as expected (status {status}).")
            self._redirect(pid)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            raise
        if _ptrace(PTRACE_DETACH, pid) != 0:
            os.kill(pid, signal.SIGKILL)
            raise KitError(f"could not let the server (pid {pid}) run: {os.strerror(ctypes.get_errno())}.")

    def _redirect(self, pid: int) -> None:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        arg_start, arg_end, env_start, env_end = (int(f) for f in fields[45:49])  # stat fields 48-51
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(env_start)
            env = mem.read(env_end - env_start)
            low = max(arg_start - STACK_SEARCH_BYTES, 0)
            mem.seek(low)
            stack = mem.read(arg_start - low)
            addresses = [arg_start]
            for arg in self.shown()[:-1]:
                addresses.append(addresses[-1] + len(os.fsencode(arg)) + 1)
            table = b"".join(POINTER.pack(a) for a in addresses)
            at = stack.rfind(table)
            if at < 0 or addresses[-1] >= arg_end:
                raise KitError(f"the server's (pid {pid}) argument table was not found; not started.")
            for i, arg in self.hidden.items():
                entry = os.fsencode(f"{ENV_PREFIX}{i}={arg}") + b"\0"
                offset = env.find(entry)
                if offset < 0 or (offset and env[offset - 1] != 0):
                    raise KitError(f"the server's (pid {pid}) environment lacks argument {i}; not started.")
                mem.seek(low + at + POINTER.size * i)
                mem.write(POINTER.pack(env_start + offset + len(f"{ENV_PREFIX}{i}=")))


def trace_me() -> None:
    """In the child before exec: stop at the exec for ``HiddenArgs.reveal`` (raises when tracing is refused)."""
    if _ptrace(PTRACE_TRACEME, 0) != 0:
        raise OSError(ctypes.get_errno(), "PTRACE_TRACEME refused")


def _ptrace(request: int, pid: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    return int(libc.ptrace(request, pid, None, None))
