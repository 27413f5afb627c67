"""``serve --ray``'s request routers measured here: the shared-prefix workload on 2 replicas of the CPU runtime with
``--router prefix`` and ``--router pow2`` (Ray Serve's default): TTFT p50/p99, requests failed, requests per
replica and the prefix hit rate the replicas' engines counted, against the ideal of every request in one cache.

    python benchmarks/ray_routing.py [--prefixes 4] [--users 16] [--turns 3] [--prefix-tokens 512]
        [--concurrency 4] [--seed 0]

Builds ``builtin:tiny-llama`` for the CPU runtime, then, one serve at a time, ``serve --ray --replicas 2:2 --router
R`` and ``bench --workload shared-prefix``'s run against it. The counts are each replica's last ``engine load``
line (``serve/ray/engine_load.py``): prompt blocks reused from its cache and full prompt blocks computed, the run's
two warm-up prompts included. The ideal is modelled (``profile/prefix_hits.py``): the same prompts in one cache.
Prints one line per router, with units and the load average. Needs the ``ray`` extra and root.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.enums import Router
from trtllm_kit.profile.prefix_hits import modelled_hits, total
from trtllm_kit.profile.shared_prefix import SharedPrefixSpec, add_spec_arguments, spec_of, turns
from trtllm_kit.profile.shared_prefix_run import SharedPrefixResult, run_shared_prefix
from trtllm_kit.serve.ray.engine_load import ENDED, EngineLoad, replica_logs
from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
from trtllm_kit.spec import ServeSettings, build_spec

BLOCK = 32  # the tiny cpu build's tokens per KV block


@dataclass(frozen=True)
class Routed:
    """One router's run: the workload's result and what each replica's engine counted."""

    router: str
    result: SharedPrefixResult
    requests: dict[str, int]  # replica log → requests it finished
    reused_blocks: int
    missed_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.reused_blocks / max(self.reused_blocks + self.missed_blocks, 1)


def ideal_hit_rate(spec: SharedPrefixSpec) -> float:
    """Full prompt blocks found in the cache when every request goes to one engine, of all full prompt blocks.

    Arguments:
        spec: the workload.
    """
    prompts = [("one", prompt.input_ids) for turn in turns(spec) for prompt in turn]
    share = total(modelled_hits(prompts, BLOCK))
    return share.hit_tokens / BLOCK / sum((len(ids) - 1) // BLOCK for _, ids in prompts)


def run_router(out: Path, router: str, spec: SharedPrefixSpec, concurrency: int, root: Path) -> Routed:
    """Serve OUT on 2 replicas with ``router`` and send the workload.

    Arguments:
        out: the cpu build; router: prefix or pow2; spec: the workload; concurrency: requests in flight per turn;
        root: where the run's records go.
    """
    port = free_port()
    state = serve_detached(ServeOptions(out=out, settings=ServeSettings(
        **asdict(free_endpoints()), openai_port=port, ready_timeout_s=600, ray=True, replicas="2:2",
        router=Router(router))))
    try:
        result = asyncio.run(run_shared_prefix(spec, f"http://127.0.0.1:{port}/v1", root / f"bench-{router}",
                                               concurrency))
        logs = replica_logs(Path(state["run_dir"], "ray", "tmp"))
    finally:
        stop_serving(out, 30)
    loads = [[load for load in map(EngineLoad.parse, lines) if load is not None] for lines in logs.values()]
    return Routed(router, result,
                  {name: sum(bool((found := ENDED.search(line)) and found["how"] == "finished") for line in lines)
                   for name, lines in logs.items()},
                  sum(found[-1].reused_blocks for found in loads if found),
                  sum(found[-1].missed_blocks for found in loads if found))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_spec_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--routers", default="prefix,pow2", help="Routers to run, in order.")
    args = parser.parse_args()
    spec = spec_of(args, args.seed)
    ideal = ideal_hit_rate(spec)
    with tempfile.TemporaryDirectory(prefix="ray-routing.") as tmp:
        root = Path(tmp)
        out = root / "out"
        run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out, "build": {"verify": False,
                                                                                       "target": "cpu"}}))
        for router in args.routers.split(","):
            routed = run_router(out, router, spec, args.concurrency, root)
            per_replica = " / ".join(str(count) for count in routed.requests.values())
            print(f"--router {router}: {routed.result.line()}; counted prefix hit rate {routed.hit_rate:.1%} of full "
                  f"prompt blocks ({routed.reused_blocks} reused, {routed.missed_blocks} computed; ideal "
                  f"{ideal:.1%}); requests per replica {per_replica}; load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
