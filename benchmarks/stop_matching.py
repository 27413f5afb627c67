"""What the OpenAI frontend's stop-sequence matching costs per streamed piece, at the request bounds.

    python benchmarks/stop_matching.py [--pieces 2000] [--json]

Two sets of stop sequences, each at the bounds of ``trtllm_kit/serve/request_limits.py`` (16 sequences of 1,000
characters, 16,000 in all): ``distinct``, whose sequences the stream never begins, and ``near-misses``, built so
that the held-back text is as long as a sequence allows and every other sequence matches it for hundreds of
characters before it fails (the matcher's worst case). Each set is fed a stream of one-character pieces, ``--pieces``
and four times as many: equal time per piece at both lengths is a cost linear in the output. Prints milliseconds
per piece with the command line that reproduces them.
"""

from __future__ import annotations

import argparse
import json
import time

from trtllm_kit.serve.openai.request_limits import MAX_STOP_CHARS, MAX_STOP_TOTAL_CHARS
from trtllm_kit.serve.openai.text import StopMatcher

COUNT = MAX_STOP_TOTAL_CHARS // MAX_STOP_CHARS  # as many sequences of the longest length as the total allows


def stop_sets() -> dict[str, tuple[list[str], str]]:
    """Each set's stop sequences and the one character its stream repeats."""
    body = MAX_STOP_CHARS - 1
    distinct = [chr(ord("b") + i) * body + "!" for i in range(COUNT)]
    half = body // 2
    near = ["a" * body + "!"] + ["a" * (half + i) + "b" * (body - half - i) + "!" for i in range(COUNT - 1)]
    return {"distinct": (distinct, "a"), "near-misses": (near, "a")}


def ms_per_piece(stops: list[str], piece: str, pieces: int) -> float:
    """Milliseconds per ``feed`` of ``piece``, over ``pieces`` of them."""
    matcher = StopMatcher(stops)
    started = time.perf_counter()
    for _ in range(pieces):
        matcher.feed(piece)
    assert not matcher.stopped, "the stream must never reach a stop sequence"
    return (time.perf_counter() - started) / pieces * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pieces", type=int, default=2000, help="Pieces in the shorter stream.")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()
    figures = {name: {str(n): round(ms_per_piece(stops, piece, n), 4) for n in (args.pieces, 4 * args.pieces)}
               for name, (stops, piece) in stop_sets().items()}
    if args.json:
        print(json.dumps(figures))
        return
    for name, by_length in figures.items():
        print(f"{name} ({COUNT} stop sequences of {MAX_STOP_CHARS} characters): "
              + ", ".join(f"{ms:.3f} ms per piece over {n} pieces" for n, ms in by_length.items()))
    print(f"reproduce: python benchmarks/stop_matching.py --pieces {args.pieces}")


if __name__ == "__main__":
    main()
