"""What parsing one OpenAI request body into a typed class costs with pydantic and with msgspec, and what each
library says of a wrong type and of an out-of-range value.

    python benchmarks/openai_parse.py [--repeat 20000] [--json]

Both parse the same fields with the same types and bounds as the frontend's ``CompletionRequest`` (strict: no
coercion, booleans are not integers): a typical body (a short prompt, a few sampling fields) and a large one (64
token-id prompts of 512 ids, 64 stop strings, every sampling field). The body is already a Python dict, as the
frontend holds it after ``serve/http/body.py``. Prints microseconds per parse (median of 5 runs after an untimed
warm-up) and each library's refusal text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

Int = Annotated[int, Strict()]
TYPICAL = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0.7, "top_p": 0.9,
           "stream": True, "stop": ["\n\n"]}
LARGE = {"model": "tiny", "prompt": [list(range(512))] * 64, "max_tokens": 256, "temperature": 0.7, "top_p": 0.9,
         "seed": 7, "stop": [f"stop {i}" for i in range(64)], "n": 2, "min_tokens": 1, "ignore_eos": False,
         "priority": 3, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5,
         "frequency_penalty": 0.5, "logprobs": 2, "echo": False, "stream": True,
         "stream_options": {"include_usage": True}}
WRONG_TYPE = {**TYPICAL, "n": True}
OUT_OF_RANGE = {**TYPICAL, "temperature": 3}


class PydanticStreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class PydanticCompletion(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    model: Any = None
    prompt: str | list[Int] | list[str | list[Int]] | None = None
    max_tokens: Int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: Int | None = Field(None, ge=0, le=2**64 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: PydanticStreamOptions | None = None
    n: Int | None = Field(None, ge=1, le=16)
    min_tokens: Int | None = None
    ignore_eos: bool = False
    priority: Int | None = Field(None, ge=-100, le=100)
    top_k: Int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: Int | None = Field(None, ge=0, le=5)
    echo: bool = False


Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]


class MsgspecStreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class MsgspecCompletion(msgspec.Struct):
    model: Any = None
    prompt: str | list[int | str | list[int]] | None = None  # msgspec takes one list type per union
    max_tokens: int | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Annotated[int, msgspec.Meta(ge=0)] | None = None  # msgspec bounds stop at int64: 2**64 - 1 is not sayable
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: MsgspecStreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=16)] | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    priority: Annotated[int, msgspec.Meta(ge=-100, le=100)] | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    echo: bool = False


@dataclass
class ParseFigures:
    """Microseconds per parse, and the refusal texts."""

    library: str
    typical_us: float
    large_us: float
    wrong_type: str
    out_of_range: str


def us_per_call(call: Callable[[], object], repeat: int) -> float:
    """The median over 5 runs of microseconds per ``call``, after an untimed warm-up."""
    for _ in range(min(repeat, 1000)):
        call()
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeat):
            call()
        runs.append((time.perf_counter() - started) / repeat * 1e6)
    return round(statistics.median(runs), 2)


def refusal(parse: Callable[[dict[str, Any]], object], body: dict[str, Any]) -> str:
    """What the library says of ``body`` (its first error)."""
    try:
        parse(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{first['loc']} {first['type']}: {first['msg']} (input {first['input']!r})"
    except msgspec.ValidationError as exc:
        return str(exc)
    raise AssertionError(f"{body} parsed")


def measure(repeat: int) -> list[ParseFigures]:
    """Both libraries on both bodies.

    Arguments:
        repeat: parses per timed run of the typical body (the large body: a tenth of them).
    """
    libraries: dict[str, Callable[[dict[str, Any]], object]] = {
        "pydantic": PydanticCompletion.model_validate,
        "msgspec": lambda body: msgspec.convert(body, MsgspecCompletion, strict=True),
    }
    return [ParseFigures(name, us_per_call(lambda p=parse: p(TYPICAL), repeat),
                         us_per_call(lambda p=parse: p(LARGE), max(1, repeat // 10)),
                         refusal(parse, WRONG_TYPE), refusal(parse, OUT_OF_RANGE))
            for name, parse in libraries.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.repeat)
    if args.json:
        print(json.dumps([asdict(f) for f in figures], indent=2))
        return
    for f in figures:
        print(f"{f.library}: typical {f.typical_us} us, large {f.large_us} us per parse; wrong type -> "
              f"{f.wrong_type}; out of range -> {f.out_of_range}")


if __name__ == "__main__":
    main()
