"""Secrets given on the command line, taken out of this process's own ``/proc/PID/cmdline``.

Any local user can read a process's command line. ``--api-key KEY`` puts the key there, for as long as the
command runs (a foreground ``serve`` for days). Python's ``sys.argv`` is a copy; the kernel shows the original
bytes, between ``arg_start`` and ``arg_end`` of ``/proc/self/stat``, and a process may write its own memory
through ``/proc/self/mem``. The entry point rewrites that range as soon as the interpreter is up: the secret
becomes ``<hidden>``, the arguments after it move up, and the freed bytes at the end are zeros. What stays is the
window before that (the interpreter's start-up, tens of milliseconds), which only the environment variable or a
key file avoids.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

SECRET_FLAGS = ("--api-key",)
HIDDEN = b"<hidden>"


def hidden_args(args: Sequence[bytes], flags: Sequence[str] = SECRET_FLAGS) -> list[bytes]:
    """``args`` with the value of each of ``flags`` (``--flag VALUE`` or ``--flag=VALUE``) replaced by
    ``<hidden>``; nothing after ``--`` is touched.

    Arguments:
        args: a command line, one item an argument.
        flags: the options whose values are secret.
    """
    names = [flag.encode() for flag in flags]
    out: list[bytes] = []
    hide_next = False
    for index, arg in enumerate(args):
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
        elif arg == b"--":
            return out + list(args[index:])
        elif arg in names:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(name + b"=") for name in names):
            out.append(arg.split(b"=", 1)[0] + b"=" + HIDDEN)
        else:
            out.append(arg)
    return out


def hide_own_secrets(flags: Sequence[str] = SECRET_FLAGS) -> bool:
    """Rewrite this process's command line as the kernel shows it, with the values of ``flags`` hidden.
    Returns False when there was nothing to hide; a system that refuses the write (no ``/proc``, a seccomp or
    Yama policy) gets one line on stderr saying the key stays visible and what to use instead.

    Arguments:
        flags: the options whose values are secret.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5), counted from 3
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(arg_start)
            raw = mem.read(arg_end - arg_start)
            args = raw.rstrip(b"\0").split(b"\0")
            hidden = hidden_args(args, flags)
            if hidden == args:
                return False
            new = b"\0".join(hidden) + b"\0"
            if len(new) > len(raw):  # a secret shorter than "<hidden>": stars of its own length instead
                new = b"\0".join(_starred(args, hidden)) + b"\0"
            mem.seek(arg_start)
            mem.write(new.ljust(len(raw), b"\0"))
        return True
    except (OSError, ValueError, IndexError):
        print(f"warning: {' / '.join(flags)} stays readable in this process's command line (the system refused "
              "to rewrite it); pass the key through the environment or a key file instead.", file=sys.stderr)
        return False


def _starred(args: list[bytes], hidden: list[bytes]) -> list[bytes]:
    """``hidden`` with each ``<hidden>`` that replaced a shorter value written as stars of that value's length."""
    out = []
    for arg, new in zip(args, hidden, strict=True):
        if new.endswith(HIDDEN) and len(new) > len(arg):
            new = new[: len(new) - len(HIDDEN)] + b"*" * (len(arg) - len(new) + len(HIDDEN))
        out.append(new)
    return out
