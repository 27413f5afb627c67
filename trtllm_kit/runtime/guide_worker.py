"""The process that compiles guides: ``python -m trtllm_kit.runtime.guide_worker``, started by ``GuideService``.

It reads frames on stdin: first ``{"tokenizer_info": ...}`` (xgrammar's serialized ``TokenizerInfo``), then
``{"id", "guide_type", "guide"}`` per guide; and writes one frame per guide on stdout: ``{"id", "compiled"}``
(xgrammar's serialized ``CompiledGrammar``) or ``{"id", "refused"}`` (the sentence), or ``{"id", "failed"}`` when
the compile died. A frame is an 8-byte little-endian length and that many bytes of JSON. Its argument is the pid of
the process that started it.

Each guide compiles in a child forked for it, so that a compile past ``GUIDE_COMPILE_TIMEOUT_S`` is killed (xgrammar
cannot be interrupted) and one past ``GUIDE_COMPILE_MEMORY_BYTES`` fails alone; at most ``MAX_CONCURRENT_COMPILES``
run at once, the others wait their turn. The process never compiles in its own thread, so it always reads its
input: when stdin closes it kills its children and exits. The worker dies with the thread that started it, and a
child with the worker (``PR_SET_PDEATHSIG``), so a killed model leaves no compile running.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import selectors
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.guide_limits import (
    GUIDE_COMPILE_MEMORY_BYTES,
    GUIDE_COMPILE_TIMEOUT_S,
    MAX_CONCURRENT_COMPILES,
    guide_field,
)

LENGTH_BYTES = 8
READ_BYTES = 1 << 20
PR_SET_PDEATHSIG = 1


def encode_frame(message: dict[str, Any]) -> bytes:
    """A message as one frame: its JSON's length, then the JSON."""
    data = json.dumps(message).encode()
    return len(data).to_bytes(LENGTH_BYTES, "little") + data


def read_frame(stream: IO[bytes]) -> dict[str, Any] | None:
    """The next message of a blocking stream, or None at its end.

    Arguments:
        stream: a binary pipe.
    """
    head = stream.read(LENGTH_BYTES)
    if len(head) < LENGTH_BYTES:
        return None
    size = int.from_bytes(head, "little")
    data = stream.read(size)
    return json.loads(data) if len(data) == size else None


class FrameBuffer:
    """Bytes read from a non-blocking pipe, cut into messages."""

    def __init__(self) -> None:
        self.data = bytearray()

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """Add ``chunk``; the messages now complete, in order."""
        self.data += chunk
        messages = []
        while len(self.data) >= LENGTH_BYTES:
            end = LENGTH_BYTES + int.from_bytes(self.data[:LENGTH_BYTES], "little")
            if len(self.data) < end:
                break
            messages.append(json.loads(bytes(self.data[LENGTH_BYTES:end])))
            del self.data[:end]
        return messages


@dataclass
class _Compile:
    """A child compiling one guide: the request, the child's pid, the read end of its pipe, its deadline and what it
    wrote so far."""

    request: dict[str, Any]
    pid: int
    fd: int
    deadline: float
    output: bytearray = field(default_factory=bytearray)


class GuideWorker:
    """The worker's loop over its input pipe and its children's pipes (one thread; it forks, never compiles).

    Arguments:
        stdin: the input pipe's descriptor; stdout: where the answers go.
    """

    def __init__(self, stdin: int, stdout: BinaryIO) -> None:
        self.stdin, self.stdout = stdin, stdout
        self.compiler: Any = None  # made from the first message
        self.selector = selectors.DefaultSelector()
        self.waiting: deque[dict[str, Any]] = deque()
        self.running: dict[int, _Compile] = {}  # fd → compile

    def run(self) -> None:
        """Serve requests until stdin closes; then kill the children."""
        frames = FrameBuffer()
        self.selector.register(self.stdin, selectors.EVENT_READ)
        try:
            while True:
                deadline = min((c.deadline for c in self.running.values()), default=None)
                for key, _ in self.selector.select(None if deadline is None else max(deadline - time.monotonic(), 0)):
                    chunk = os.read(key.fd, READ_BYTES)
                    if key.fd == self.stdin:
                        if not chunk:
                            return
                        self._take(frames.feed(chunk))
                    elif chunk:
                        self.running[key.fd].output += chunk
                    else:
                        self._finish(self.running[key.fd])
                now = time.monotonic()
                for late in [c for c in self.running.values() if c.deadline <= now]:
                    os.kill(late.pid, signal.SIGKILL)
                    self._finish(late, {"refused": f"{guide_field(late.request['guide_type'])} did not compile "
                                                   f"within {GUIDE_COMPILE_TIMEOUT_S:g} s, the bound on a guide's "
                                                   "compile time: send a simpler guide."})
                while self.waiting and len(self.running) < MAX_CONCURRENT_COMPILES:
                    self._start(self.waiting.popleft())
        finally:
            for compile_ in list(self.running.values()):
                os.kill(compile_.pid, signal.SIGKILL)
                self._finish(compile_, reply=False)

    def _take(self, messages: list[dict[str, Any]]) -> None:
        for message in messages:
            if self.compiler is None:
                from trtllm_kit.runtime.grammar import GrammarCompiler, _xgrammar

                info = _xgrammar().TokenizerInfo.deserialize_json(message["tokenizer_info"])
                self.compiler = GrammarCompiler(info)
            else:
                self.waiting.append(message)

    def _start(self, request: dict[str, Any]) -> None:
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: compile, answer on the pipe, exit without running the parent's cleanup
            os.close(read_fd)
            _compile_child(self.compiler, request, write_fd, parent)
        os.close(write_fd)
        self.running[read_fd] = _Compile(request, pid, read_fd, time.monotonic() + GUIDE_COMPILE_TIMEOUT_S)
        self.selector.register(read_fd, selectors.EVENT_READ)

    def _finish(self, compile_: _Compile, verdict: dict[str, Any] | None = None, reply: bool = True) -> None:
        """Forget a child (reaped) and answer its request: ``verdict``, else what the child wrote."""
        self.selector.unregister(compile_.fd)
        os.close(compile_.fd)
        del self.running[compile_.fd]
        _, status = os.waitpid(compile_.pid, 0)
        if not reply:
            return
        if verdict is None:
            written = FrameBuffer().feed(bytes(compile_.output))
            verdict = written[0] if written and status == 0 else {
                "failed": f"the guide's compile process ended ({_how(status)})"}
        self.stdout.write(encode_frame({"id": compile_.request["id"], **verdict}))
        self.stdout.flush()


def _compile_child(compiler: Any, request: dict[str, Any], write_fd: int, parent: int) -> None:
    """Compile one guide within the memory bound and write the verdict as a frame; never returns."""
    from trtllm_kit.runtime.grammar import Guide

    code = 1
    try:
        die_with(parent)
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as statm:
            limit = int(statm.read().split()[0]) * resource.getpagesize() + GUIDE_COMPILE_MEMORY_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
        guide = Guide(request["guide_type"], request["guide"])
        try:
            verdict = {"compiled": compiler.compile(guide).to_json()}
        except MemoryError:
            verdict = {"refused": f"{guide_field(guide.guide_type)} needs more than "
                                  f"{GUIDE_COMPILE_MEMORY_BYTES >> 20} MiB to compile, the bound on a guide's compile "
                                  "memory: send a simpler guide."}
        except KitUsageError as exc:
            verdict = {"refused": str(exc)}
        with os.fdopen(write_fd, "wb") as out:
            out.write(encode_frame(verdict))
        code = 0
    finally:
        os._exit(code)


def die_with(parent: int) -> None:
    """Be killed when ``parent``, the process that started this one, ends (and exit now if it has already).

    Arguments:
        parent: its pid.
    """
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def main() -> None:
    """Answer on a copy of stdout (anything a library prints goes to stderr) until stdin closes or the parent, whose
    pid is the first argument, ends."""
    die_with(int(sys.argv[1]))
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    GuideWorker(sys.stdin.fileno(), answers).run()


if __name__ == "__main__":
    main()
