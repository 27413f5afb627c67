"""``--replicas MIN:MAX`` and ``--target-ongoing N`` as Ray Serve's autoscaling config of the model deployment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import KitUsageError

UPSCALE_DELAY_S = 2.0  # requests above the target for this long add a replica
DOWNSCALE_DELAY_S = 30.0  # and below it for this long remove one (to MIN, 0 included)


@dataclass(frozen=True)
class Autoscaling:
    """How many replicas serve the model and the ongoing requests per replica the autoscaler aims at.

    Arguments:
        min_replicas: kept even when idle (0: scale to zero); max_replicas: at most;
        target_ongoing: requests in flight per replica (Ray Serve's ``target_ongoing_requests``).
    """

    min_replicas: int
    max_replicas: int
    target_ongoing: float

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < 1 or self.min_replicas > self.max_replicas:
            raise KitUsageError(f"--replicas is {self.min_replicas}:{self.max_replicas}; give MIN:MAX with "
                                "0 <= MIN <= MAX and MAX >= 1.")
        if self.target_ongoing <= 0:
            raise KitUsageError(f"--target-ongoing is {self.target_ongoing:g}; give a positive number of requests "
                                "per replica.")

    @classmethod
    def parse(cls, replicas: str, target_ongoing: float) -> Autoscaling:
        """The autoscaling of ``--replicas MIN:MAX`` (or ``N``: exactly N) and ``--target-ongoing``.

        Arguments:
            replicas: the flag's text; target_ongoing: requests per replica.
        """
        low, _, high = replicas.partition(":")
        try:
            bounds = int(low), int(high or low)
        except ValueError:
            raise KitUsageError(f"--replicas is {replicas!r}; give MIN:MAX as two whole numbers, e.g. 1:4.") from None
        return cls(*bounds, target_ongoing)

    def ray_config(self) -> dict[str, Any]:
        """Ray Serve's ``autoscaling_config``."""
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing,
                "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}
