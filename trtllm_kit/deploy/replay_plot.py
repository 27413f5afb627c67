"""The replay as a picture: the load and the autoscaler's signal above, the replica count below."""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.deploy.simulate import ScalingSpec, Step


def plot_replay(steps: list[Step], spec: ScalingSpec, load: list[tuple[float, float]], out: Path,
                title: str = "") -> Path:
    """Write a PNG of the replay.

    Arguments:
        steps: the replay; spec: the autoscaler (its target is drawn); load: (time, requests in the server);
        out: the PNG path; title: its title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = steps[0].t
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5), height_ratios=(3, 2))
    if load:
        top.plot([(t - t0) / 60 for t, _ in load], [v for _, v in load], color="0.6", label="requests in the server")
    top.step([(s.t - t0) / 60 for s in steps], [s.value or 0 for s in steps], where="post", color="C0",
             label="autoscaler signal: requests waiting")
    top.step([(s.t - t0) / 60 for s in steps], [spec.target * s.replicas for s in steps], where="post",
             color="C0", linestyle=":", label=f"target {spec.target:g} x replicas")
    top.set_ylabel("requests")
    top.legend(loc="upper right", fontsize=8)
    bottom.step([(s.t - t0) / 60 for s in steps], [s.replicas for s in steps], where="post", color="C3",
                label="replicas")
    bottom.step([(s.t - t0) / 60 for s in steps], [s.recommended for s in steps], where="post", color="C3",
                alpha=0.3, label="raw recommendation")
    bottom.set_ylim(0, spec.max_replicas + 0.5)
    bottom.set_ylabel("replicas")
    bottom.set_xlabel("minutes")
    bottom.legend(loc="upper right", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
