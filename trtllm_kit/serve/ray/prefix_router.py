"""Prefix-affinity routing across the model's replicas, as a Ray Serve request router.

A request whose prompt starts with a block some replica served last (``prefix.py``'s key) goes to that replica,
whose engine holds that block in its KV cache, unless its requests in flight exceed the least loaded replica's by
more than ``max_imbalance``; then, and for a prefix not seen yet, it is routed as Ray Serve's default does: the
less loaded of two replicas drawn at random. The owner of a prefix is the replica that served it last; the table
keeps the ``max_prefixes`` most recent.

Ray Serve builds the router in the process that holds the deployment's handle (the driver) and calls
``initialize_state`` with the deployment's ``request_router_kwargs``.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from trtllm_kit.serve.ray.prefix import prefix_key
from trtllm_kit.wire import GenerationRequest

DEFAULT_MAX_IMBALANCE = 4  # requests in flight an owner may carry above the least loaded replica
DEFAULT_MAX_PREFIXES = 4096


class PrefixRouter(FIFOMixin, RequestRouter):
    """Routes a prompt to the replica that served its first block last; power of two choices otherwise."""

    def initialize_state(self, tokens_per_block: int = 32, max_imbalance: int = DEFAULT_MAX_IMBALANCE,
                         max_prefixes: int = DEFAULT_MAX_PREFIXES, **_unused: Any) -> None:
        """Set the router's state (Ray Serve calls it with ``request_router_kwargs``).

        Arguments:
            tokens_per_block: the engine's KV cache block, in tokens; max_imbalance: how many more requests in
            flight than the least loaded replica the prefix's owner may have; max_prefixes: prefixes remembered.
        """
        self.tokens_per_block = tokens_per_block
        self.max_imbalance = max_imbalance
        self.max_prefixes = max_prefixes
        self.owners: OrderedDict[str, ReplicaID] = OrderedDict()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """The prefix's owner first when its load allows, then two replicas at random.

        Arguments:
            candidate_replicas: the replicas running; pending_request: the request to route.
        """
        if not candidate_replicas:
            return []
        drawn = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        key = self._key(pending_request)
        owner = None if key is None else self.owners.get(key)
        chosen = next((replica for replica in candidate_replicas if replica.replica_id == owner), None)
        if chosen is None or self._load(chosen) - min(map(self._load, candidate_replicas)) > self.max_imbalance:
            return [drawn]
        return [[chosen], [replica for replica in drawn if replica is not chosen]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        """Make the replica that took the request its prefix's owner.

        Arguments:
            pending_request: the request; replica_id: where it went; result: its result (unused).
        """
        key = self._key(pending_request)
        if key is None:
            return
        self.owners[key] = replica_id
        self.owners.move_to_end(key)
        while len(self.owners) > self.max_prefixes:
            self.owners.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget the prefixes a dead replica owned.

        Arguments:
            replica_id: the replica.
        """
        super().on_replica_actor_died(replica_id)
        for key in [key for key, owner in self.owners.items() if owner == replica_id]:
            del self.owners[key]

    def _key(self, pending_request: PendingRequest | None) -> str | None:
        args = pending_request.args if pending_request is not None else []
        if not args or not isinstance(args[0], GenerationRequest):
            return None
        return prefix_key(args[0].prompt, self.tokens_per_block)

    def _load(self, replica: RunningReplica) -> int:
        return self.replica_queue_len_cache.get(replica.replica_id) or 0
