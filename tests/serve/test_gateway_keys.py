"""The key file and the limits without a server: hashes at rest, revocation, the CLI, buckets and periods."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from trtllm_kit.cli import run
from trtllm_kit.serve.gateway.keys import KeyRecord, read_keys
from trtllm_kit.serve.gateway.quotas import KeyLimits, period_bounds


def test_keys_add_prints_the_key_once_and_stores_only_a_salted_hash(tmp_path: Path, capsys) -> None:
    path = tmp_path / "keys.json"
    assert run(["keys", "add", "a", "--keys", str(path), "--models", "m1, m2", "--rps", "2", "--tpm", "100",
                "--quota-tokens", "1000", "--quota-period", "month", "--tenant", "acme"]) == 0
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("sk-kit-") and secret not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    keys = read_keys(path)
    assert keys.find(secret).name == "a" and keys.find(secret + "x") is None and keys.find("") is None
    assert run(["keys", "list", "--keys", str(path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["tenant"], r["models"], r["rps"], r["tpm"], r["quota_tokens"], r["revoked"])
            for r in listed] == [("a", "acme", ["m1", "m2"], 2.0, 100, 1000, False)]
    assert "key_hash" not in listed[0]
    assert run(["keys", "revoke", "a", "--keys", str(path)]) == 0
    assert read_keys(path).find(secret) is None
    assert run(["keys", "add", "ops", "--keys", str(path), "--admin"]) == 0
    admin = capsys.readouterr().out.splitlines()[-1]
    assert read_keys(path).find(admin).admin and not read_keys(path).named("a").admin
    assert run(["keys", "list", "--keys", str(path)]) == 0
    assert "\tadmin\tlive" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.parametrize(("argv", "message"), [
    (["keys", "add", "b", "--quota-tokens", "5"], "Error: key 'b': a quota needs both --quota-tokens and "
                                                  "--quota-period day|month, got 5 per None.\n"),
    (["keys", "revoke", "b"], "has no key named 'b'; it has a.\n"),
    (["keys", "add", "a"], "already has a key named 'a'; pick another name or revoke it first.\n"),
])
def test_keys_errors(tmp_path: Path, capsys, argv: list[str], message: str) -> None:
    path = tmp_path / "keys.json"
    assert run(["keys", "add", "a", "--keys", str(path)]) == 0
    capsys.readouterr()
    assert run([*argv, "--keys", str(path)]) == 2
    assert capsys.readouterr().err.endswith(message)


def test_period_bounds_are_utc_days_and_months() -> None:
    at = datetime(2024, 2, 10, 13, 0, tzinfo=timezone.utc).timestamp()
    day, month = period_bounds("day", at), period_bounds("month", at)
    assert day == (datetime(2024, 2, 10, tzinfo=timezone.utc).timestamp(),
                   datetime(2024, 2, 11, tzinfo=timezone.utc).timestamp())
    assert month == (datetime(2024, 2, 1, tzinfo=timezone.utc).timestamp(),
                     datetime(2024, 3, 1, tzinfo=timezone.utc).timestamp())


def test_limits_admit_to_the_configured_numbers() -> None:
    rps = KeyLimits.of(KeyRecord("r", "h", rps=3))
    assert [rps.admit(1) is None for _ in range(4)] == [True, True, True, False]
    quota = KeyLimits.of(KeyRecord("q", "h", quota_tokens=10, quota_period="day"))
    quota.count_past(8, datetime.now(timezone.utc).timestamp())
    quota.count_past(50, 0.0)  # long ago: another period
    assert quota.admit(2) is None
    refusal = quota.admit(1)
    assert refusal is not None and refusal.is_quota and 0 < refusal.wait_s <= 86400
    assert refusal.reason == "the daily quota of 10 tokens is used (8 used, 2 reserved by requests in flight)"
    quota.settle(2, 1)  # it used less than it reserved: the rest is free again
    assert (quota.used_tokens, quota.reserved_tokens) == (9, 0) and quota.admit(5) is None


def test_concurrent_reservations_keep_a_quota_within_one_reservation() -> None:
    quota = KeyLimits.of(KeyRecord("q", "h", quota_tokens=30, quota_period="day"))
    admitted = [r for r in (53,) * 20 if quota.admit(r) is None]  # 20 at once, none settled yet
    assert admitted == [53]
    small = KeyLimits.of(KeyRecord("s", "h", quota_tokens=30, quota_period="day"))
    admitted = [r for r in (7,) * 20 if small.admit(r) is None]
    assert admitted == [7] * 5 and sum(admitted) <= 30 + 7  # admitted at 0, 7, 14, 21, 28 reserved


def test_the_minute_bucket_takes_the_reservation_and_gives_back_the_rest() -> None:
    tpm = KeyLimits.of(KeyRecord("t", "h", tpm=20))
    assert [tpm.admit(7) is None for _ in range(5)] == [True, True, True, False, False]  # 20, 13, 6, -1
    assert tpm.tokens is not None and tpm.tokens.level <= -1 + 1e-3
    for _ in range(3):
        tpm.settle(7, 2)  # each used 2 of its 7
    assert 13.9 <= tpm.tokens.level <= 14.1
    big = KeyLimits.of(KeyRecord("b", "h", tpm=20))
    assert [big.admit(203) is None for _ in range(20)] == [True] + [False] * 19
