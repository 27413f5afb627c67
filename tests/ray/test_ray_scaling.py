"""``--replicas MIN:MAX`` and ``--target-ongoing``: Ray Serve's autoscaling config, and the refusals of bad values."""

from __future__ import annotations

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.ray.scaling import DOWNSCALE_DELAY_S, UPSCALE_DELAY_S, Autoscaling


@pytest.mark.parametrize(("replicas", "bounds"), [("1:4", (1, 4)), ("0:2", (0, 2)), ("3", (3, 3)), ("2:2", (2, 2))])
def test_parse_reads_min_and_max(replicas: str, bounds: tuple[int, int]) -> None:
    scaling = Autoscaling.parse(replicas, 4)
    assert (scaling.min_replicas, scaling.max_replicas) == bounds


def test_ray_config_is_ray_serves_autoscaling_config() -> None:
    assert Autoscaling.parse("0:3", 2.5).ray_config() == {
        "min_replicas": 0, "max_replicas": 3, "target_ongoing_requests": 2.5,
        "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}


@pytest.mark.parametrize(("replicas", "target", "message"), [
    ("two", 4, "--replicas is 'two'; give MIN:MAX as two whole numbers, e.g. 1:4."),
    ("1:x", 4, "--replicas is '1:x'; give MIN:MAX as two whole numbers, e.g. 1:4."),
    ("3:1", 4, "--replicas is 3:1; give MIN:MAX with 0 <= MIN <= MAX and MAX >= 1."),
    ("0:0", 4, "--replicas is 0:0; give MIN:MAX with 0 <= MIN <= MAX and MAX >= 1."),
    ("-1:2", 4, "--replicas is -1:2; give MIN:MAX with 0 <= MIN <= MAX and MAX >= 1."),
    ("1:2", 0, "--target-ongoing is 0; give a positive number of requests per replica."),
])
def test_bad_values_are_refused_in_one_sentence(replicas: str, target: float, message: str) -> None:
    with pytest.raises(KitUsageError) as caught:
        Autoscaling.parse(replicas, target)
    assert str(caught.value) == message
