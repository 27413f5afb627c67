"""The ``trtllm-kit`` command (and ``python -m trtllm_kit``): the signal handlers first, then the CLI.

Importing the CLI takes a few hundred milliseconds (click, rich); a Ctrl-C meanwhile must end the command
like any other, with exit code 130 and one line, not a traceback from the middle of an import. Once the
command has returned, further signals are ignored: its work is done and its exit code says how it went, and
the objects it leaves are frozen out of the garbage collector's last passes (finalizers and ``atexit`` still run).
"""

from __future__ import annotations

import gc
import os
import signal
import sys


def main() -> None:
    """Hide secrets given as arguments from other users, install the kit's SIGINT/SIGTERM handling, run the
    CLI, and exit with its code (130 when interrupted)."""
    from trtllm_kit.argv_secrets import SECRET_FLAGS, hide_own_secrets
    from trtllm_kit.interrupts import INTERRUPTED, INTERRUPTS

    if any(arg.split("=", 1)[0] in SECRET_FLAGS for arg in sys.argv[1:]):
        hide_own_secrets()

    INTERRUPTS.install()
    try:
        from trtllm_kit.cli import run

        code = run()
    except KeyboardInterrupt:  # before the command itself started (an import, the argument parser)
        print(f"Error: {INTERRUPTED}", file=sys.stderr)
        code = 130
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    if code == 130:
        # Every cleanup has run. A KeyboardInterrupt that went through an extension's ``PyRun_String`` on its way
        # makes the interpreter's own exit kill it with SIGINT (status -2, not 130): leave before that.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    gc.freeze()  # the interpreter's collections at exit would walk every object torch made, for nothing
    if LEAK_LISTING_MODULE in sys.modules:
        _quiet_finalization()
    sys.exit(code)


# OpenAI Triton's compiler module (imported by torch._dynamo where it is installed, as xgrammar installs it) lists
# every object of its own still alive when the interpreter ends: 40 lines after a command that succeeded.
LEAK_LISTING_MODULE = "triton._C.libtriton"


def _quiet_finalization() -> None:
    """Send what the interpreter writes to stderr while it ends to /dev/null (the command's output is flushed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


if __name__ == "__main__":
    main()
