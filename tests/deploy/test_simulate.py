"""The HPA replay: desired = ceil(current x metric / target) per sync, tolerance, stabilisation windows, policies."""

from __future__ import annotations

import pytest

from trtllm_kit.deploy.simulate import Policy, Rules, ScalingSpec, replay

NO_WINDOW = Rules(0, ())


def spec(up: Rules = NO_WINDOW, down: Rules = NO_WINDOW, target: float = 4.0, bounds: tuple[int, int] = (1, 10)):
    return ScalingSpec(bounds[0], bounds[1], target, up, down)


def replicas(series, scaling, **kwargs):
    return [s.replicas for s in replay(series, scaling, **kwargs)]


def test_desired_is_the_total_over_the_target_within_bounds():
    series = [(0, 0.0), (15, 10.0), (30, 40.0), (45, 100.0), (60, 3.0)]
    assert replicas(series, spec()) == [1, 3, 10, 10, 1]  # ceil(10/4)=3, ceil(40/4)=10, capped at 10


def test_tolerance_keeps_the_count_near_the_target():
    series = [(0, 8.0), (15, 8.6), (30, 9.0)]  # 2 replicas: 4.3/4 is within 10 %, 4.5/4 is not
    assert replicas(series, spec(), start_replicas=2) == [2, 2, 3]


def test_scale_down_waits_for_the_window_and_follows_the_policy():
    down = Rules(60, (Policy("Pods", 1, 30),))
    series = [(0, 16.0), (15, 0.0)]
    steps = replicas(series, spec(down=down), start_replicas=4, until=180)
    # held at 4 while the 4-replica recommendation of t=0 is in the window, then one pod per 30 s
    assert steps == [4, 4, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1]


def test_scale_up_window_ignores_a_short_burst():
    up = Rules(60, (Policy("Pods", 2, 60),))
    burst = [(0, 0.0), (15, 40.0), (30, 0.0)]
    assert set(replicas(burst, spec(up=up), until=120)) == {1}
    sustained = [(0, 0.0), (15, 40.0)]
    assert replicas(sustained, spec(up=up), until=135) == [1, 1, 1, 1, 3, 3, 3, 3, 5, 5]  # a minute on, +2 a minute


@pytest.mark.parametrize(("select", "expected"), [("Max", 4), ("Min", 3)])
def test_policies_combine_by_select(select, expected):
    up = Rules(0, (Policy("Pods", 1, 60), Policy("Percent", 100, 60)), select)
    assert replicas([(0, 40.0)], spec(up=up), start_replicas=2)[0] == expected
