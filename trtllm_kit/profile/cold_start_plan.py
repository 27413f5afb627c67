"""The phases of a cold start on a GPU node, planned: what ``bench cold-start`` measures here, predicted from the
volume's read rate and the target's start-up terms (``targets/*.py``), and the read rate a start under
``GOAL_S`` needs.

The terms are the budgets the startupProbe is given (their sources in docs/deploy-kubernetes.md), so they bound a
start rather than predict it; no upstream publishes TensorRT-LLM's engine load or CUDA-graph capture times. The
read is the part a deployment chooses: Run:ai Model Streamer (parallel ranged reads) brought Llama-3-8B from
S3-class storage in 14.3 s against 48.0 s with plain safetensors reads, fastsafetensors 4.8-7.5x; a volume staged
on the node ahead of time (a pre-pulled claim, local NVMe) takes the fetch out altogether.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_kit.targets import get_target

GOAL_S = 30.0
LLAMA_8B_BYTES = 8_030_261_248 * 2  # Llama-3.1-8B's parameters in BF16


@dataclass(frozen=True)
class PlannedColdStart:
    """Seconds of each phase on a GPU node, and the read rate (GB/s) at which the fetch and the weight read together
    take no more than ``GOAL_S`` (None: the fetch alone takes longer)."""

    weight_bytes: int
    load_gbps: float
    fetch_s: float
    weight_read_s: float
    runtime_init_s: float
    warmup_s: float
    first_token_s: float
    needed_gbps: float | None

    @property
    def total_s(self) -> float:
        return self.fetch_s + self.weight_read_s + self.runtime_init_s + self.warmup_s + self.first_token_s

    def phases(self) -> dict[str, float]:
        return {"artifact fetch": self.fetch_s, "weight read": self.weight_read_s,
                "runtime init": self.runtime_init_s, "warm-up": self.warmup_s, "first token": self.first_token_s}

    def to_dict(self) -> dict[str, float | int | None]:
        return {"weight_bytes": self.weight_bytes, "load_gbps": self.load_gbps, **{
            f"{name.replace(' ', '_').replace('-', '')}_s": round(s, 1) for name, s in self.phases().items()},
            "total_s": round(self.total_s, 1), "needed_gbps": self.needed_gbps}


def plan_cold_start(weight_bytes: int, target: str, load_gbps: float, *, fetch_gbps: float | None = None) -> \
        PlannedColdStart:
    """The phases of one start of ``weight_bytes`` of weights served by ``target``.

    Arguments:
        weight_bytes: what the replica reads; target: the build target (its start-up terms); load_gbps: the
        volume's read rate; fetch_gbps: the rate an init container fetches the artifact at (None: pre-staged).
    """
    terms = get_target(target).startup_terms
    fetch_s = weight_bytes / (fetch_gbps * 1e9) if fetch_gbps else 0.0
    left_s = GOAL_S - fetch_s
    needed = round(weight_bytes / 1e9 / left_s, 2) if left_s > 0 else None
    return PlannedColdStart(weight_bytes, load_gbps, fetch_s, weight_bytes / (load_gbps * 1e9),
                            float(terms.runtime_init_s + terms.kv_alloc_s), float(terms.cuda_graphs_s), 0.0, needed)


def describe(planned: PlannedColdStart, eight_b: PlannedColdStart) -> list[str]:
    """Lines for ``plan --cold-start``: the phases, then what an 8B model needs to start under ``GOAL_S``."""
    lines = [f"cold start on a GPU node, {planned.weight_bytes / 1e9:.2f} GB of weights at {planned.load_gbps:g} GB/s: "
             f"{planned.total_s:.0f} s at most"]
    lines += [f"  {name:<15} {seconds:7.1f} s" for name, seconds in planned.phases().items()]
    other = eight_b.runtime_init_s + eight_b.warmup_s
    if eight_b.needed_gbps is None:
        lines.append(f"an 8B model (16.1 GB in BF16) cannot start under {GOAL_S:g} s: fetching its artifact alone "
                     "takes longer; stage the weights on the node.")
    else:
        lines.append(f"an 8B model (16.1 GB in BF16) reads its weights within {GOAL_S:g} s only at "
                     f"{eight_b.needed_gbps:g} GB/s or more (parallel ranged reads: Run:ai Model Streamer brought it "
                     "from S3-class storage in 14.3 s, plain reads in 48.0 s; or a volume staged on the node), and "
                     f"runtime init and warm-up, budgeted {other:.0f} s here, must then be measured on the GPU "
                     "(trtllm-kit bench cold-start) to stay inside the rest.")
    return lines
