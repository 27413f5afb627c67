"""The CPU runtime's step loop: schedule → one batched forward pass over the paged KV pool → sample → postprocess.

A step packs every scheduled sequence's new tokens (generation tokens and context chunks alike) into one row
for the linear layers of ``CheckpointModel`` (all TP ranks, all PP stages, its ``linear``), writes their K/V
into the pool's slots, and attends per sequence over the K/V gathered through its block table.
Logits are computed for each sampled sequence's last position and, for a sequence that asked for prompt logprobs
or context logits, for every prompt position. A request of several sequences computes its prompt once; its
forks start on the first sequence's blocks (``Scheduler.fork``) and sample their first token from its logits.
Each sampled token's raw logprob is summed into ``cum_logprob`` (and kept with its alternatives on request,
``runtime/logprobs.py``).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.attention_groups import attend_groups, attention_groups, span_of
from trtllm_kit.runtime.batch_decode import BatchDecode
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.kv_transfer import KvBlocks, check_layout, read_blocks, token_slots, write_tokens
from trtllm_kit.runtime.logprobs import record_generated, record_prompt
from trtllm_kit.runtime.lora import AdapterCache, AdapterWeights, LoraBatch
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sampling import sample, sampling_error
from trtllm_kit.runtime.scheduler import Scheduler
from trtllm_kit.runtime.sequence import SamplingParams, Sequence, SequenceStatus
from trtllm_kit.runtime.single_decode import SingleDecode, plain_layers
from trtllm_kit.runtime.speculation import Speculator
from trtllm_kit.runtime.stats import ExecutorStats
from trtllm_kit.runtime.threads import StepThreads


class Executor:
    """Owns the model, the scheduler and the K/V pool; ``step()`` advances every running sequence by one step."""

    def __init__(self, model: CheckpointModel, config: EngineConfig, speculator: Speculator | None = None) -> None:
        """Arguments:
        model: a loaded checkpoint; config: batching and KV-pool settings; speculator: drafts verified each step
        (``runtime/speculation.py``; None: none).
        """
        self.model, self.config, self.speculator = model, config, speculator
        self.scheduler = Scheduler(config)
        self.lora_cache = AdapterCache(config.lora_cache_max_adapters)
        dims = model.dims
        shape = (dims.num_layers, dims.tp_size, config.num_kv_blocks * config.tokens_per_block,
                 dims.num_kv_heads_per_rank, dims.head_size)
        self.k_cache = torch.zeros(shape, dtype=model.dtype)
        self.v_cache = torch.zeros(shape, dtype=model.dtype)
        # each (layer, rank)'s [slots, kv_heads, d] part of the pool, as views taken once rather than every step
        self.kv_parts = [[(self.k_cache[layer, rank], self.v_cache[layer, rank]) for rank in range(dims.tp_size)]
                         for layer in range(dims.num_layers)]
        # a plain checkpoint's layers, looked up once for both decode paths (None: every step takes the general path)
        layers = plain_layers(model)
        self.single_decode = None if layers is None else SingleDecode(model, layers, self.k_cache, self.v_cache,
                                                                      config.tokens_per_block)
        self.batch_decode = None if layers is None else BatchDecode(model, layers, self.k_cache, self.v_cache,
                                                                    config.tokens_per_block)
        self._seq_ids = itertools.count()
        self.num_steps = self.total_scheduled = self.peak_scheduled = 0
        self.last_scheduled = self.last_context = self.last_context_tokens = self.last_tokens = 0
        self.step_threads: StepThreads | None = None  # a server's threads for each step (None: torch's as set)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: Path, config: EngineConfig,
                        compute_dtype: torch.dtype = torch.float32) -> Executor:
        """Load a TensorRT-LLM checkpoint (any tp/pp) and build an engine over it.

        Arguments:
            ckpt_dir: the checkpoint directory; config: engine settings; compute_dtype: as ``CheckpointModel.load``.
        """
        return cls(CheckpointModel.load(Path(ckpt_dir), compute_dtype), config)

    def add_request(self, prompt_ids: list[int], params: SamplingParams, arrival_time: float | None = None,
                    lora: AdapterWeights | None = None, *, hold_kv: bool = False,
                    prefilled: tuple[list[int], KvBlocks] | None = None) -> Sequence:
        """Queue a request; raises ``KitUsageError`` for one that can never run (``LoraNotCachedError`` for an
        adapter neither cached nor sent) and ``QueueFullError``. Returns its first sequence; ``seq.group`` holds
        all ``params.num_sequences`` of them.

        Arguments:
            prompt_ids: input token ids; params: sampling settings; arrival_time: ``time.perf_counter()`` value;
            lora: the request's LoRA task id and, when not cached, its weights (None: the base model);
            hold_kv: a context-only request: once its first token is made its blocks stay (``export_kv``) until
            ``release``; prefilled: a generation-only request: the first tokens made elsewhere and its prompt's K/V,
            installed when it is admitted (it then continues from them; it ends at once when they reach
            ``max_tokens``).
        """
        vocab = self.model.dims.vocab_size
        if any(not 0 <= t < vocab for t in [*prompt_ids, *(prefilled[0] if prefilled else [])]):
            raise KitUsageError(f"input_ids hold a token outside the vocabulary [0, {vocab}).")
        if any(not 0 <= t < vocab for t in params.draft_ids):
            raise KitUsageError(f"draft_input_ids hold a token outside the vocabulary [0, {vocab}); send the ids of a "
                                "draft with the target's tokenizer.")
        if (hold_kv or prefilled) and params.num_sequences > 1:
            raise KitUsageError("a disaggregated request samples one sequence; send n and best_of 1.")
        adapter = self.lora_cache.resolve(lora) if lora is not None else None
        if prefilled is not None:
            if prefilled[1].num_tokens != len(prompt_ids):
                raise KitUsageError(f"the transferred KV cache holds {prefilled[1].num_tokens} tokens but the prompt "
                                    f"has {len(prompt_ids)}; send the context request's prompt unchanged.")
            check_layout(self.k_cache, prefilled[1])
            return self._add_prefilled(Sequence(next(self._seq_ids), prompt_ids, params, arrival_time, 0, adapter),
                                       *prefilled)
        group = [Sequence(next(self._seq_ids), prompt_ids, params, arrival_time, index, adapter)
                 for index in range(params.num_sequences)]
        for seq in group:
            seq.group, seq.fork_of = group, (group[0] if seq.index else None)
        group[0].holds_kv = hold_kv
        self.scheduler.add(group[0])
        return group[0]

    def _add_prefilled(self, seq: Sequence, first_ids: list[int], kv: KvBlocks) -> Sequence:
        for token_id in first_ids:
            seq.append_token(token_id)
        if seq.finish_reason is not None:  # the first tokens complete it: nothing to compute
            seq.status = SequenceStatus.FINISHED
            return seq
        seq.kv_import = kv
        self.scheduler.add(seq)
        return seq

    def export_kv(self, seq: Sequence) -> KvBlocks:
        """A copy of a held context-only sequence's prompt K/V, in the pool's block layout.

        Arguments:
            seq: a sequence in ``scheduler.held``.
        """
        assert seq.seq_id in self.scheduler.held, "only a held sequence's blocks stay valid"
        return read_blocks(self.k_cache, self.v_cache, seq.block_table, self.config.tokens_per_block,
                           seq.num_prompt_tokens)

    def release(self, seq: Sequence) -> None:
        """Free a held context-only sequence's blocks (after its transfer, or when nobody fetched it in time).

        Arguments:
            seq: a sequence of this engine.
        """
        self.scheduler.release(seq)

    def cancel(self, seq: Sequence) -> None:
        """Stop a sequence now and free its blocks (and its group's forks still waiting for its prompt).

        Arguments:
            seq: a sequence of this engine; finished ones are left as they are.
        """
        if not seq.is_finished:
            self.scheduler.finish(seq, "cancelled")

    def has_work(self) -> bool:
        return not self.scheduler.is_finished()

    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        """One iteration; returns the sequences that received a token (or ended) and those that finished (a
        sequence that could not be sampled finishes with reason ``error`` and its ``error`` sentence)."""
        seqs = self.scheduler.schedule()
        for seq in seqs:
            if seq.kv_import is not None:  # admitted now: its blocks receive the transferred K/V
                slots = token_slots(seq.block_table, self.config.tokens_per_block, seq.kv_import.num_tokens)
                write_tokens(self.k_cache, self.v_cache, slots, seq.kv_import)
                seq.kv_import = None
        context = [s for s in seqs if s.num_output_tokens == 0 or s.num_uncomputed_tokens > 1]
        self.last_scheduled, self.last_context = len(seqs), len(context)
        self.last_context_tokens = sum(s.num_scheduled_tokens for s in context)
        self.last_tokens = sum(s.num_scheduled_tokens for s in seqs)
        if not seqs:
            return [], []
        speculator = self.speculator
        drafted = speculator.attach(seqs, self.scheduler) if speculator is not None else []
        sampled = [s for s in seqs if s.num_computed_tokens + s.num_scheduled_tokens == len(s) and not s.is_finished
                   and s not in drafted]
        if self.step_threads is not None:  # set on the thread that steps: torch's count is each thread's own
            wanted = self.step_threads.of_rows(sum(s.num_scheduled_tokens for s in seqs))  # drafts counted
            if torch.get_num_threads() != wanted:
                torch.set_num_threads(wanted)
        logits = self._forward(seqs, sampled, drafted)  # always: context chunks fill the cache
        drafted_finished = speculator.verify(drafted, logits[len(sampled):], self.scheduler) if speculator else []
        logits = logits[:len(sampled)]
        rows, forks = list(range(len(sampled))), []
        for row, seq in enumerate(sampled):
            if any(other.fork_of is seq for other in seq.group):
                started, copies = self.scheduler.fork(seq)
                self._copy_blocks(copies)
                forks += started
                rows += [row] * len(started)
        sampled, logits = sampled + forks, logits[rows]
        before = [s.num_output_tokens for s in sampled]
        token_of = dict(zip((s.seq_id for s in sampled), sample(logits, sampled), strict=True))
        finished = self.scheduler.postprocess(seqs + forks, [token_of.get(s.seq_id) for s in seqs + forks])
        finished += drafted_finished
        record_generated(logits, sampled, [s.num_output_tokens > n for s, n in zip(sampled, before, strict=True)])
        for seq in sampled:  # a sequence whose numbers could not be sampled ends alone; its neighbours go on
            if token_of[seq.seq_id] is None and not seq.is_finished:
                seq.error = sampling_error(seq)
                self.scheduler.finish(seq, "error")
                finished.append(seq)
        if speculator is not None:
            speculator.forget(finished)
        self.num_steps += 1
        self.total_scheduled += len(seqs)
        self.peak_scheduled = max(self.peak_scheduled, len(seqs))
        return sampled + drafted, finished

    def generate(self, prompts: list[list[int]], params: list[SamplingParams],
                 loras: list[AdapterWeights | None] | None = None) -> list[list[int]]:
        """Run requests to completion (all queued at once); returns each one's output ids.

        Arguments:
            prompts: input token ids per request; params: sampling settings per request;
            loras: each request's adapter (None: all run the base model).
        """
        loras = loras or [None] * len(prompts)
        seqs = [self.add_request(p, sp, lora=lr) for p, sp, lr in zip(prompts, params, loras, strict=True)]
        while self.has_work():
            self.step()
        return [seq.output_ids for seq in seqs]

    @torch.inference_mode()
    def _forward(self, seqs: list[Sequence], sampled: list[Sequence], drafted: list[Sequence]) -> torch.Tensor:
        """Compute the scheduled tokens of ``seqs``; logits of the last position of each of ``sampled``, then of
        every scheduled position of each of ``drafted`` (its last token and its draft)."""
        if self.single_decode is not None and self.single_decode.can_decode(seqs, sampled, drafted):
            return self.single_decode.decode(seqs[0])  # batch 1, one new token: the same values in fewer calls
        if self.batch_decode is not None and self.batch_decode.can_decode(seqs, sampled, drafted):
            return self.batch_decode.decode(seqs)  # one new token each: the same values in fewer calls
        model, tpb = self.model, self.config.tokens_per_block
        starts = [s.num_computed_tokens for s in seqs]
        counts = [s.num_scheduled_tokens for s in seqs]
        ends = [a + n for a, n in zip(starts, counts, strict=True)]
        offsets = [sum(counts[:i]) for i in range(len(seqs))]
        ids = [t for s, a, b in zip(seqs, starts, ends, strict=True) for t in s.token_ids[a:b]]
        positions = torch.cat([torch.arange(a, b) for a, b in zip(starts, ends, strict=True)])[None]
        slots = [(torch.tensor(s.block_table)[:, None] * tpb + torch.arange(tpb)).flatten()[:e]
                 for s, e in zip(seqs, ends, strict=True)]
        new_slots = torch.cat([ks[a:b] for ks, a, b in zip(slots, starts, ends, strict=True)])
        written = span_of(new_slots) or new_slots  # consecutive slots: a copy into a view, not a scatter
        groups = attention_groups(starts, counts, offsets, slots)
        lora = LoraBatch.of_sequences([s.adapter for s in seqs], counts)
        # The query heads sharing a KV head become rows of that head: no repeated K/V, same math.
        heads_per_kv = model.dims.num_heads_per_rank // model.dims.num_kv_heads_per_rank
        masks = [None if g.mask is None else g.mask.repeat(1, 1, heads_per_kv, 1) for g in groups]  # once a step
        is_whole = len(groups) == 1 and groups[0].out_index.tolist() == list(range(len(ids)))
        hidden = model.embed(torch.tensor([ids]))
        for layer in range(model.dims.num_layers):
            x = model.norm(layer, "input_layernorm", hidden)
            contexts = []
            for rank in range(model.dims.tp_size):
                q, k, v = model.qkv(layer, rank, x, positions, max(ends), lora)  # [1, heads, N, d]
                k_cache, v_cache = self.kv_parts[layer][rank]
                k_cache[written], v_cache[written] = k[0].transpose(0, 1), v[0].transpose(0, 1)
                contexts.append(attend_groups(q, k_cache, v_cache, groups, masks, is_whole)[None])
            hidden = hidden + model.attention_output(layer, contexts, lora)
            hidden = hidden + model.mlp(layer, model.norm(layer, "post_layernorm", hidden), lora)
        last = {s.seq_id: o + c - 1 for s, o, c in zip(seqs, offsets, counts, strict=True)}
        wanted = [last[s.seq_id] for s in sampled]
        wanted += [r for s in drafted for r in range(last[s.seq_id] - s.num_scheduled_tokens + 1, last[s.seq_id] + 1)]
        num_sampled = len(wanted)
        spans = []  # (sequence, first prompt position, its row in the logits, rows)
        for seq, start, offset, count in zip(seqs, starts, offsets, counts, strict=True):
            num_prompt = min(start + count, seq.num_prompt_tokens) - start
            if seq.params.needs_prompt_logits and num_prompt > 0:
                spans.append((seq, start, len(wanted), num_prompt))
                wanted += range(offset, offset + num_prompt)
        if not wanted:
            return torch.empty(0, model.dims.vocab_size)
        logits = model.logits(hidden[:, wanted])[0]
        for seq, start, row, num_prompt in spans:
            record_prompt(seq, start, logits[row:row + num_prompt])
        return logits[:num_sampled]

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy the K/V of each (source, destination) block pair: a fork's own copy of a shared partial block."""
        tpb = self.config.tokens_per_block
        for source, destination in copies:
            for cache in (self.k_cache, self.v_cache):
                cache[:, :, destination * tpb:(destination + 1) * tpb] = cache[:, :, source * tpb:(source + 1) * tpb]

    def stats(self) -> ExecutorStats:
        """The current counters and gauges."""
        scheduler, manager = self.scheduler, self.scheduler.block_manager
        return ExecutorStats(
            active=len(scheduler.running), waiting=len(scheduler.waiting), max=self.config.max_batch_size,
            scheduled=self.last_scheduled, context=self.last_context,
            generation_requests=self.last_scheduled - self.last_context, total_context_tokens=self.last_context_tokens,
            step_tokens=self.last_tokens,
            blocks_max=manager.num_blocks, blocks_free=manager.num_free_blocks,
            blocks_used=manager.num_used_blocks,
            tokens_per_block=manager.tokens_per_block, blocks_reused=manager.num_reused_blocks,
            blocks_missed=manager.num_missed_blocks, preemptions=scheduler.num_preemptions,
            iteration_counter=self.num_steps, total_scheduled_requests=self.total_scheduled,
            peak_scheduled=self.peak_scheduled, timestamp=time.time())

