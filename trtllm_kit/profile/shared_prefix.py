"""The shared-prefix workload: K system prompts × M users, multi-turn.

User ``u`` talks under system prompt ``u % K``. Its turn ``t`` sends the system prompt, every earlier turn's user
message and reply, then turn ``t``'s message, so each turn repeats the conversation so far and a server that
keeps the conversation's blocks computes only the new tail. The replies in the history are seeded token ids (the
workload does not depend on what the server answered), so the whole workload is a function of its spec.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.workload import Prompt

SYSTEM, USER, REPLY, ORDER = 1, 2, 3, 4  # seed streams: a system prompt, a user's message, a reply in
# the history, the order of a turn's users


@dataclass(frozen=True)
class SharedPrefixSpec:
    """K system prompts of ``prefix_tokens`` tokens shared by M users over T turns.

    Arguments:
        num_prefixes: system prompts (K).
        num_users: users (M); user ``u`` uses system prompt ``u % K``.
        num_turns: turns per user (T).
        prefix_tokens: tokens of each system prompt (P).
        turn_tokens: tokens of each user message.
        osl: tokens of each reply (forced on the server; the history holds a seeded reply of this length).
        vocab_size: prompt ids are ordinary ids below it.
        special_ids: ids never put in a prompt.
        seed: seed of every token.
    """

    num_prefixes: int = 4
    num_users: int = 16
    num_turns: int = 3
    prefix_tokens: int = 512
    turn_tokens: int = 32
    osl: int = 16
    vocab_size: int = 1000
    special_ids: tuple[int, ...] = (0, 1, 2)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_prefixes", "num_users", "num_turns", "prefix_tokens", "turn_tokens", "osl"):
            if getattr(self, name) < 1:
                raise KitUsageError(f"shared-prefix {name} must be at least 1, got {getattr(self, name)}; "
                                    "raise it.")
        if self.num_users < self.num_prefixes:
            raise KitUsageError(f"shared-prefix users ({self.num_users}) are fewer than its prefixes "
                                f"({self.num_prefixes}), so some prefixes would never be sent; give --users ≥ "
                                "--prefixes.")
        if self.vocab_size <= len(set(self.special_ids)):
            raise KitUsageError(f"vocab_size {self.vocab_size} leaves no ordinary token ids to sample prompts from.")

    def prefix_of(self, user: int) -> int:
        """The system prompt user ``user`` talks under."""
        return user % self.num_prefixes


FLAGS = {  # a benchmark's flag → (the spec's field, its help)
    "--prefixes": ("num_prefixes", "System prompts."),
    "--users": ("num_users", "Users (user u under system prompt u %% prefixes)."),
    "--turns": ("num_turns", "Turns per user."),
    "--prefix-tokens": ("prefix_tokens", "Tokens per system prompt."),
    "--turn-tokens": ("turn_tokens", "Tokens per user message."),
    "--osl": ("osl", "Tokens per reply."),
}


def add_spec_arguments(parser: argparse.ArgumentParser, defaults: SharedPrefixSpec | None = None) -> None:
    """The workload's flags (``FLAGS``) and ``--concurrency`` on a benchmark's parser.

    Arguments:
        parser: the benchmark's parser; defaults: the flags' defaults (the spec's own when None).
    """
    defaults = defaults or SharedPrefixSpec()
    for flag, (name, help) in FLAGS.items():
        parser.add_argument(flag, dest=name, type=int, default=getattr(defaults, name), metavar="N", help=help)
    parser.add_argument("--concurrency", type=int, default=4, help="Requests in flight within a turn.")


def spec_of(args: argparse.Namespace, seed: int = 0) -> SharedPrefixSpec:
    """The workload ``add_spec_arguments``' flags give, with ``seed``.

    Arguments:
        args: the parsed flags; seed: the workload's seed.
    """
    return SharedPrefixSpec(seed=seed, **{name: getattr(args, name) for name, _ in FLAGS.values()})


def _ids(spec: SharedPrefixSpec, stream: int, key: tuple[int, ...], count: int) -> tuple[int, ...]:
    allowed = np.setdiff1d(np.arange(spec.vocab_size, dtype=np.int64), np.array(spec.special_ids, dtype=np.int64))
    rng = np.random.default_rng([spec.seed, stream, *key])
    return tuple(int(t) for t in allowed[rng.integers(0, len(allowed), count)])


def system_prompt(spec: SharedPrefixSpec, prefix: int) -> tuple[int, ...]:
    """System prompt ``prefix``'s token ids.

    Arguments:
        spec: the workload.
        prefix: its number, below ``spec.num_prefixes``.
    """
    return _ids(spec, SYSTEM, (prefix,), spec.prefix_tokens)


def turn_prompt(spec: SharedPrefixSpec, user: int, turn: int) -> Prompt:
    """User ``user``'s request at turn ``turn``: system prompt, the earlier turns (message and reply), the new
    message. Its id is ``u{user}.t{turn}``.

    Arguments:
        spec: the workload.
        user: the user, below ``spec.num_users``.
        turn: the turn, below ``spec.num_turns``.
    """
    ids = list(system_prompt(spec, spec.prefix_of(user)))
    for earlier in range(turn):
        ids += _ids(spec, USER, (user, earlier), spec.turn_tokens)
        ids += _ids(spec, REPLY, (user, earlier), spec.osl)
    ids += _ids(spec, USER, (user, turn), spec.turn_tokens)
    return Prompt(f"u{user}.t{turn}", tuple(ids), spec.osl)


def turns(spec: SharedPrefixSpec) -> list[list[Prompt]]:
    """Every request, one list per turn: turn ``t`` holds each user's turn ``t`` in a seeded order of the users
    (in user order, a round-robin over W workers would send the users of one prefix to one worker whenever W
    divides K); a user's turn ``t + 1`` is sent only after every turn ``t`` ended.

    Arguments:
        spec: the workload.
    """
    return [[turn_prompt(spec, int(user), turn)
             for user in np.random.default_rng([spec.seed, ORDER, turn]).permutation(spec.num_users)]
            for turn in range(spec.num_turns)]
