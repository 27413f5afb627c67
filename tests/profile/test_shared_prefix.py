"""The shared-prefix workload's shape without a server: who shares which prompt, the turns, determinism; and the
hit rate modelled from routing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.prefix_hits import modelled_hits, response_request_id, served_by, total
from trtllm_kit.profile.shared_prefix import (
    SharedPrefixSpec,
    add_spec_arguments,
    spec_of,
    system_prompt,
    turn_prompt,
    turns,
)

SPEC = SharedPrefixSpec(num_prefixes=3, num_users=7, num_turns=3, prefix_tokens=40, turn_tokens=5, osl=4,
                        vocab_size=500, seed=11)


def test_users_of_one_prefix_share_exactly_its_tokens() -> None:
    first = [turn_prompt(SPEC, user, 0).input_ids for user in range(SPEC.num_users)]
    for user, ids in enumerate(first):
        assert ids[:40] == system_prompt(SPEC, user % 3)
        assert len(ids) == 40 + 5
    assert first[0][:40] == first[3][:40] == first[6][:40]
    assert first[0][:40] != first[1][:40] != first[2][:40]
    assert first[0][40:] != first[3][40:]  # each user's message is its own


def test_each_turn_repeats_the_conversation_so_far() -> None:
    by_turn = [{p.request_id: p for p in turn} for turn in turns(SPEC)]
    assert [sorted(t) for t in by_turn] == [sorted(f"u{u}.t{t}" for u in range(7)) for t in range(3)]
    for user in range(SPEC.num_users):
        ids = [by_turn[turn][f"u{user}.t{turn}"].input_ids for turn in range(3)]
        assert [len(x) for x in ids] == [45, 54, 63]  # + message and reply of each earlier turn
        assert ids[1][:45] == ids[0] and ids[2][:54] == ids[1]
        assert by_turn[2][f"u{user}.t2"].osl == 4


def test_a_turn_sends_its_users_in_a_seeded_order_that_does_not_follow_their_prefixes() -> None:
    spec = SharedPrefixSpec(num_prefixes=4, num_users=16, num_turns=2, prefix_tokens=8, turn_tokens=2, osl=1)
    orders = [[p.request_id.split(".")[0] for p in turn] for turn in turns(spec)]
    assert orders != [[f"u{u}" for u in range(16)]] * 2 and orders[0] != orders[1]
    assert orders == [[p.request_id.split(".")[0] for p in turn] for turn in turns(spec)]
    # a round-robin over 2 workers in this order puts the users of some prefix on both workers
    placed = {(int(name[1:]) % 4, position % 2) for position, name in enumerate(orders[0])}  # (prefix, worker)
    assert any({(prefix, 0), (prefix, 1)} <= placed for prefix in range(4))


def test_the_workload_is_a_function_of_its_spec() -> None:
    again = turns(SharedPrefixSpec(**{**SPEC.__dict__}))
    assert again == turns(SPEC)
    other = turns(SharedPrefixSpec(**{**SPEC.__dict__, "seed": 12}))
    assert other[0][0].input_ids != again[0][0].input_ids
    ids = {t for turn in again for p in turn for t in p.input_ids}
    assert ids.isdisjoint(SPEC.special_ids) and max(ids) < 500


@pytest.mark.parametrize(("values", "bound"), [({"num_users": 2}, "--users ≥ --prefixes"),
                                               ({"num_turns": 0}, "num_turns must be at least 1, got 0")])
def test_a_workload_that_cannot_run_is_refused(values: dict[str, int], bound: str) -> None:
    with pytest.raises(KitUsageError, match=bound):
        SharedPrefixSpec(**{**SPEC.__dict__, **values})


def test_modelled_hits_count_the_blocks_a_worker_already_holds() -> None:
    a = tuple(range(10, 26))  # 16 tokens: blocks of 4
    b = (*a[:8], 90, 91, 92, 93, 94)  # shares two blocks with a
    shares = modelled_hits([("w0", a), ("w1", b), ("w0", b), ("w0", a)], 4)
    assert (shares["w0"].num_requests, shares["w0"].prompt_tokens, shares["w0"].hit_tokens) == (3, 45, 8 + 12)
    assert shares["w1"].hit_tokens == 0  # its cache never saw a
    assert total(shares).hit_rate == pytest.approx(20 / 58)
    one = total(modelled_hits([("one", a), ("one", b), ("one", b), ("one", a)], 4))
    # the ideal: b's second send finds its own third block; a's repeat reuses 3 of its 4 blocks (never the last)
    assert one.hit_tokens == 8 + 12 + 12


def test_requests_are_named_to_the_worker_whose_log_completed_them(tmp_path: Path) -> None:
    (tmp_path / "worker-0.log").write_text("INFO push_handler: request completed request_id=aa-1 x\n")
    (tmp_path / "worker-1.log").write_text("junk\nINFO push_handler: request completed request_id=bb-2 x\n")
    assert served_by(tmp_path) == {"aa-1": "worker-0", "bb-2": "worker-1"}
    assert response_request_id("cmpl-bb-2") == "bb-2"
    with pytest.raises(KitUsageError, match="holds no worker-"):
        served_by(tmp_path / "frontend")


@pytest.mark.parametrize(("flags", "message"), [
    ([], "Error: --workload shared-prefix sends token-id prompts to an OpenAI endpoint; pass --openai-url "
         "http://HOST:PORT/v1.\n"),
    (["--openai-url", "http://127.0.0.1:9/v1", "--concurrency", "1,4"],
     "Error: --workload shared-prefix takes one whole --concurrency, got '1,4'; example: --concurrency 4.\n"),
    (["--openai-url", "http://127.0.0.1:9/v1", "--users", "2"],
     "Error: shared-prefix users (2) are fewer than its prefixes (4), so some prefixes would never be sent; give "
     "--users ≥ --prefixes.\n"),
])
def test_bench_refuses_a_shared_prefix_run_it_cannot_make(flags: list[str], message: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from trtllm_kit.cli import cli

    result = CliRunner().invoke(cli, ["bench", "--workload", "shared-prefix", "--out", str(tmp_path), *flags])
    assert (result.exit_code, result.output) == (2, message)


def test_a_benchmarks_flags_give_the_workload() -> None:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser, SharedPrefixSpec(num_prefixes=8))
    args = parser.parse_args(["--users", "9", "--turns", "2", "--prefix-tokens", "64", "--turn-tokens", "8",
                              "--osl", "5", "--concurrency", "3"])
    assert spec_of(args, 7) == SharedPrefixSpec(num_prefixes=8, num_users=9, num_turns=2, prefix_tokens=64,
                                                turn_tokens=8, osl=5, seed=7)
    assert args.concurrency == 3
    defaults = argparse.ArgumentParser()
    add_spec_arguments(defaults)
    assert spec_of(defaults.parse_args([])) == SharedPrefixSpec()
