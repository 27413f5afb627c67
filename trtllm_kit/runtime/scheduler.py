"""Which sequences run in the next step, and how many of their tokens: in-flight batching over a paged KV pool.

Policies (``batch_scheduler_policy``):
* ``guaranteed_no_evict``: a request is admitted only when blocks for its full length (prompt plus
  ``request_output_len``) can be reserved; otherwise it waits. Nothing is ever evicted.
* ``max_utilization``: a request is admitted when its next chunk fits; when a running sequence cannot grow,
  the most recently admitted ones are preempted (blocks freed, recomputed later from their tokens).
* ``static``: static batching, for comparison: a batch is formed only when the previous one has finished
  completely, and no request joins a running batch. As in a static batch, a finished request keeps its
  slot, its KV blocks and its compute (a padding row recomputing its last position) until the batch ends.
Priorities (``SamplingParams.priority``, TensorRT-LLM's 0–1 float, higher first): the waiting queue is ordered
by priority, then arrival; and under ``max_utilization`` and ``guaranteed_no_evict`` a waiting sequence that
cannot start (no batch slot or no blocks) preempts the lowest-priority running sequence below its own priority
(the most recently admitted of them), whose blocks are freed and whose tokens are recomputed when it runs again.
This is the only eviction ``guaranteed_no_evict`` makes, and it never happens while every priority is equal.
Each step spends at most ``max_num_tokens`` tokens: one per generating sequence, the rest on context
(prompt) tokens; with chunked context a long prompt is computed over several steps.
A request sampling several sequences (``SamplingParams.num_sequences``) is admitted as its first sequence, with
room for its forks' blocks; once that sequence's prompt is computed, ``fork`` starts the others on its blocks.
A fork that finds no batch slot or no blocks then waits in the queue and computes its prompt itself.
Fairness across requests: among waiting sequences of one priority, the next to start is one of the request
holding the fewest running sequences (a newly arrived request goes before another request's queued choices), and
under ``max_utilization`` and ``guaranteed_no_evict`` a waiting sequence that cannot start preempts the most
recently admitted sequence of the request holding the most of the batch, while that request holds at least two
more running sequences than its own (never one of a higher priority). So one request's ``n`` choices never keep
a newly arrived request of its priority out of the batch: it starts at the next step.
"""

from __future__ import annotations

from collections import Counter, deque

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.block_manager import BlockManager
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.handle import QueueFullError
from trtllm_kit.runtime.sequence import Sequence, SequenceStatus


class Scheduler:
    """Owns the waiting and running queues and the block manager."""

    def __init__(self, config: EngineConfig) -> None:
        """Arguments:
        config: the engine settings (batch and token limits, policy, pool size, reuse, chunking).
        """
        self.config = config
        self.block_manager = BlockManager(config.num_kv_blocks, config.tokens_per_block,
                                          config.enable_kv_cache_reuse)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.padding: list[Sequence] = []  # static batching: finished members of the running batch
        self.held: dict[int, Sequence] = {}  # finished context-only requests whose blocks await their transfer
        self.num_preemptions = 0

    def is_finished(self) -> bool:
        return not self.waiting and not self.running and not self.padding

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence, refusing what could never run or what the queue cannot hold.

        Arguments:
            seq: a fresh sequence.
        """
        config, capacity = self.config, self.block_manager.num_blocks * self.config.tokens_per_block
        if seq.max_num_tokens > capacity:
            raise KitUsageError(f"request {seq.seq_id} needs up to {seq.max_num_tokens} tokens of KV cache "
                                f"({seq.num_prompt_tokens} input + {seq.params.max_tokens} output) but the pool "
                                f"holds {capacity}; shorten it or raise max_tokens_in_paged_kv_cache.")
        if config.max_seq_len and seq.max_num_tokens > config.max_seq_len:
            raise KitUsageError(f"request {seq.seq_id} asks for {seq.num_prompt_tokens} input + "
                                f"{seq.params.max_tokens} output tokens, more than max_seq_len {config.max_seq_len}; "
                                "lower request_output_len.")
        if (seq.num_prompt_tokens > config.max_num_tokens and not config.enable_chunked_context
                and seq.kv_import is None):
            raise KitUsageError(f"request {seq.seq_id} has {seq.num_prompt_tokens} input tokens, more than "
                                f"max_num_tokens {config.max_num_tokens}; shorten it or set "
                                "enable_chunked_context.")
        queued = len(self.waiting) - max(config.max_batch_size - len(self.running), 0)  # beyond free batch slots
        if config.max_queue_size and queued >= config.max_queue_size:
            raise QueueFullError(f"the request queue is full ({queued} requests wait for a batch slot, "
                                 f"max_queue_size {config.max_queue_size}); retry later or raise max_queue_size.")
        self._enqueue(seq)

    def _enqueue(self, seq: Sequence, first: bool = False) -> None:
        """Queue ``seq`` after every waiting sequence of a higher priority (and, unless ``first``, of its own)."""
        priority = seq.params.priority
        index = next((i for i, other in enumerate(self.waiting) if other.params.priority < priority
                      or (first and other.params.priority == priority)), len(self.waiting))
        self.waiting.insert(index, seq)

    def _reserve(self, seq: Sequence) -> int:
        """Tokens ``seq`` holds blocks for from its admission: its length (``max_utilization``) or its maximum."""
        return len(seq) if self.config.batch_scheduler_policy == "max_utilization" else seq.max_num_tokens

    def _fork_blocks(self, seq: Sequence) -> int:
        """Blocks the waiting forks of ``seq`` will take when its prompt is computed: of as many forks as the whole
        pool could hold beside it (the others will queue on their own)."""
        num_forks = sum(other.fork_of is seq for other in seq.group)
        if not num_forks:
            return 0
        manager, reserve = self.block_manager, self._reserve(seq)
        per_fork = max(manager.fork_blocks(seq, reserve), 1)
        room = max(manager.num_blocks - manager.blocks_needed(reserve), 0)
        return min(num_forks, room // per_fork) * per_fork

    def _admissible(self, seq: Sequence) -> bool:
        """Whether ``seq`` could start now: a batch slot, and blocks for its prompt (``max_utilization``) or its
        whole reservation, and for its forks."""
        return len(self.running) < self.config.max_batch_size and self.block_manager.can_allocate(
            seq, self._reserve(seq), self._fork_blocks(seq))

    def _running_per_request(self) -> Counter[int]:
        """Running sequences of each request, by the id of its first sequence."""
        return Counter(seq.group[0].seq_id for seq in self.running)

    def _head(self) -> Sequence:
        """The waiting sequence to start next: the highest priority, then the request with the fewest running
        sequences, then the queue's order."""
        running = self._running_per_request()
        return min(self.waiting, key=lambda seq: (-seq.params.priority, running[seq.group[0].seq_id]))

    def _preempt_for_waiting(self) -> None:
        """While the next waiting sequence cannot start, preempt for it: a lower-priority running sequence, else one
        of the request of its priority holding at least two more running sequences than its own."""
        if self.config.batch_scheduler_policy == "static":
            return
        while self.waiting and not self._admissible(head := self._head()):
            victim = self._lower_priority(head) or self._over_share(head)
            if victim is None:
                return
            self._preempt(victim)

    def _lower_priority(self, head: Sequence) -> Sequence | None:
        """The most recently admitted running sequence of the lowest priority below ``head``'s, if any."""
        lower = [s for s in self.running if s.params.priority < head.params.priority]
        return _lowest_latest(lower) if lower else None

    def _over_share(self, head: Sequence) -> Sequence | None:
        """The most recently admitted sequence of the request holding the most running sequences of ``head``'s
        priority, when it holds at least two more than ``head``'s request (None otherwise). A sequence that could
        not compute its tokens again in one step (no chunked context) is never taken."""
        config, running = self.config, self._running_per_request()
        movable = [s for s in self.running if s.params.priority <= head.params.priority
                   and (config.enable_chunked_context or len(s) <= config.max_num_tokens)
                   and not any(other.fork_of is s for other in s.group)]
        if not movable:
            return None
        request = max((s.group[0].seq_id for s in movable), key=running.__getitem__)
        if running[request] < running[head.group[0].seq_id] + 2:
            return None
        return next(s for s in reversed(movable) if s.group[0].seq_id == request)

    def _chunk(self, seq: Sequence, num_uncomputed: int, budget: int) -> int:
        """Tokens of ``seq`` to compute within ``budget``: all of them, a chunk, or 0 (wait)."""
        if num_uncomputed <= budget:
            return num_uncomputed
        return budget if self.config.enable_chunked_context else 0

    def schedule(self) -> list[Sequence]:
        """Pick this step's sequences and set their ``num_scheduled_tokens``; blocks are allocated here."""
        policy, manager = self.config.batch_scheduler_policy, self.block_manager
        self._preempt_for_waiting()
        budget, scheduled, num_preempted = self.config.max_num_tokens, [], self.num_preemptions
        running = list(self.running)
        while running:
            seq = running.pop(0)
            num_tokens = self._chunk(seq, seq.num_uncomputed_tokens, budget)
            if num_tokens == 0:
                continue
            while not manager.can_append(seq, seq.num_computed_tokens + num_tokens):
                assert policy == "max_utilization", "reserved sequences never run out of blocks"
                victim = _lowest_latest([seq, *running])  # who makes room: it or a sequence after it
                if victim is not seq:
                    running.remove(victim)
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                manager.append(seq, seq.num_computed_tokens + num_tokens)
                seq.num_scheduled_tokens = num_tokens
                scheduled.append(seq)
                budget -= num_tokens
        if policy == "static" and self.running:
            for seq in self.padding:
                seq.num_computed_tokens, seq.num_scheduled_tokens = len(seq) - 1, 1
            return scheduled + self.padding
        for seq in self.padding:  # the static batch is over
            self.block_manager.free(seq)
        self.padding = []
        if self.num_preemptions > num_preempted:
            return scheduled  # a pool too full to admit anyone this step
        while self.waiting and len(self.running) < self.config.max_batch_size and budget > 0:
            seq = self._head()
            computed = max(len(manager.prefix_hits(seq)) * manager.tokens_per_block, seq.num_imported_tokens)
            num_tokens = self._chunk(seq, len(seq) - computed, budget)
            first = computed + num_tokens
            reserve = first if policy == "max_utilization" else max(seq.max_num_tokens, first)
            if num_tokens == 0 or not manager.can_allocate(seq, reserve, self._fork_blocks(seq)):
                break
            self.waiting.remove(seq)
            manager.allocate(seq, reserve)
            seq.status, seq.num_scheduled_tokens = SequenceStatus.RUNNING, num_tokens
            self.running.append(seq)
            scheduled.append(seq)
            budget -= num_tokens
        return scheduled

    def fork(self, seq: Sequence) -> tuple[list[Sequence], list[tuple[int, int]]]:
        """Start the forks of ``seq``, whose prompt was just computed, on its blocks; returns them and the
        (source, destination) blocks whose K/V must be copied. A fork without a batch slot or blocks is queued.

        Arguments:
            seq: the first sequence of a group, all of its tokens computed this step.
        """
        started, copies = [], []
        for fork in [other for other in seq.group if other.fork_of is seq]:
            fork.fork_of = None
            reserve = self._reserve(fork)
            if len(self.running) >= self.config.max_batch_size or not self.block_manager.can_fork(seq, reserve):
                self._enqueue(fork)
                continue
            copy = self.block_manager.fork(seq, fork, reserve)
            if copy is not None:
                copies.append(copy)
            fork.num_computed_tokens, fork.status = len(fork), SequenceStatus.RUNNING
            fork.prompt_logprobs, fork.context_logits = seq.prompt_logprobs, seq.context_logits
            self.running.append(fork)
            started.append(fork)
        return started, copies

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks and put it first in line; its tokens are recomputed later."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(seq, first=True)

    def postprocess(self, seqs: list[Sequence], token_ids: list[int | None]) -> list[Sequence]:
        """Advance the computed tokens, append sampled tokens and retire finished sequences; returns those.

        Arguments:
            seqs: the step's scheduled sequences; token_ids: the sampled token of each, None for a context chunk
            that did not reach the end of the sequence.
        """
        finished = []
        for seq, token_id in zip(seqs, token_ids, strict=True):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.seal(seq)
            if token_id is None or seq.is_finished:
                continue
            seq.append_token(token_id)
            if seq.finish_reason is not None:
                self.finish(seq, seq.finish_reason)
                finished.append(seq)
        return finished

    def release(self, seq: Sequence) -> None:
        """Free the blocks of a held context-only sequence (transferred, or never fetched in time).

        Arguments:
            seq: a sequence in ``held``; any other is left as it is.
        """
        if self.held.pop(seq.seq_id, None) is not None:
            self.block_manager.free(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence at once (finished or cancelled) and free its blocks.

        Arguments:
            seq: a waiting or running sequence; reason: ``length``, ``end_id``, ``stop_words``, ``cancelled``,
            ``error``.
        """
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            if seq.holds_kv and reason == "length":  # its first token made: the K/V waits for its transfer
                self.held[seq.seq_id] = seq
            elif self.config.batch_scheduler_policy == "static" and reason != "cancelled":
                self.padding.append(seq)
            else:
                self.block_manager.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason, seq.fork_of = SequenceStatus.FINISHED, reason, None
        for fork in [other for other in seq.group if other.fork_of is seq]:  # its prompt will not be computed
            if reason == "cancelled":
                self.finish(fork, reason)
            else:
                fork.fork_of = None
                self._enqueue(fork)


def _lowest_latest(seqs: list[Sequence]) -> Sequence:
    """The sequence of the lowest priority in ``seqs`` (not empty), the latest on a tie."""
    lowest = min(s.params.priority for s in seqs)
    return [s for s in seqs if s.params.priority == lowest][-1]
