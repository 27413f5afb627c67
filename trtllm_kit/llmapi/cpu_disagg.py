"""``DisaggregatedParams`` on the CPU ``LLM``: context-only requests hold their KV blocks for a generation server,
generation-only requests fetch them (``kv_transceiver.py``) and continue.

A ``context_only`` request runs with ``max_tokens`` 1; when its one token ends it by length, its blocks stay
held and its completion carries ``DisaggregatedParams(request_type="context_only", first_gen_tokens,
ctx_request_id, opaque_state)`` (without ``opaque_state`` when it ended otherwise, e.g. on the end token: there is
nothing to continue). A ``generation_only`` request's ``opaque_state`` must carry the signature of a context
peer (``kv_state.py``: the transfer key both roles share), else ``generate_async`` refuses it before anything
connects anywhere; it then fetches the blocks in a thread of its own, then joins the engine with its prompt's K/V
installed and the first tokens appended, and generates the rest: greedy output is token-exact against one engine
running the whole request. Every failure of the fetch ends that request alone, with the reason.
``context_and_generation`` runs as a plain request.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from trtllm_kit.llmapi.disaggregated_params import DisaggregatedParams
from trtllm_kit.llmapi.kv_dirs import dir_tag
from trtllm_kit.llmapi.kv_state import transfer_key, verify
from trtllm_kit.llmapi.kv_transceiver import DEFAULT_TIMEOUT_S, KvTransceiver, TransferError, fetch
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.handle import Failure
from trtllm_kit.runtime.kv_transfer import KvLayout
from trtllm_kit.runtime.loop import EngineLoop, Submission
from trtllm_kit.runtime.sequence import Sequence


class Disaggregation:
    """One ``LLM``'s context and generation roles; requests reach the engine through ``loop`` (the LLM's engine
    loop, set once it runs).

    Arguments:
        engine: the LLM's engine; cache_transceiver_config: the LLM argument (its ``kv_transfer_timeout_ms`` bounds
        how long held blocks wait for their fetch).
    """

    def __init__(self, engine: Executor, cache_transceiver_config: dict[str, Any] | None) -> None:
        timeout_ms = (cache_transceiver_config or {}).get("kv_transfer_timeout_ms")
        self.engine, self.layout = engine, KvLayout.of(engine.k_cache)
        self.loop: EngineLoop | None = None
        self.transceiver = KvTransceiver(engine.export_kv, lambda seq: self._loop().release(seq), transfer_key(),
                                         dir_tag(), DEFAULT_TIMEOUT_S if timeout_ms is None else int(timeout_ms) / 1000)
        self.num_transfers, self.transfer_s = 0, 0.0  # generation side: KV blocks received, seconds spent
        self._lock = threading.Lock()

    def submit(self, submission: Submission, disagg: DisaggregatedParams) -> None:
        """Queue a request carrying ``disagg`` (called where ``generate_async`` runs).

        Arguments:
            submission: the request as a plain one is submitted; disagg: its disaggregated parameters.
        """
        if disagg.draft_tokens:
            raise ValueError("draft_tokens are not used by the CPU runtime; send disaggregated_params without them")
        if disagg.request_type == "context_only":
            self._loop().submit(replace(submission, params=submission.params.with_max_tokens(1), hold_kv=True))
        elif disagg.request_type == "generation_only":
            if not disagg.first_gen_tokens or disagg.opaque_state is None:
                raise ValueError("a generation_only request needs the context-only response's first_gen_tokens "
                                 "and opaque_state")
            endpoint, handle = verify(self.transceiver.key, disagg.opaque_state)
            threading.Thread(target=self._fetch_then_add, args=(submission, disagg.first_gen_tokens, endpoint, handle),
                             daemon=True).start()
        else:
            self._loop().submit(submission)

    def _loop(self) -> EngineLoop:
        assert self.loop is not None, "the LLM's engine loop runs"
        return self.loop

    def _fetch_then_add(self, submission: Submission, first_gen_tokens: list[int], endpoint: str,
                        handle: str) -> None:
        try:
            kv, seconds = fetch(endpoint, handle, self.layout, len(submission.prompt_ids))
        except TransferError as exc:
            submission.handle.failed(str(exc), Failure.UNAVAILABLE)
            return
        except Exception as exc:  # the request is answered whatever the transfer raised
            submission.handle.failed(f"the KV blocks could not be received ({type(exc).__name__}); send the request "
                                     "again", Failure.UNAVAILABLE)
            return
        with self._lock:
            self.num_transfers += 1
            self.transfer_s += seconds
        self._loop().submit(replace(submission, prefilled=(list(first_gen_tokens), kv)))

    def finished(self, seq: Sequence) -> DisaggregatedParams | None:
        """The parameters a finished context-only sequence returns (engine thread); None for other requests.

        Arguments:
            seq: a sequence that just finished.
        """
        if not seq.holds_kv:
            return None
        held = seq.seq_id in self.engine.scheduler.held
        return DisaggregatedParams(request_type="context_only", first_gen_tokens=list(seq.output_ids),
                                   ctx_request_id=seq.seq_id,
                                   opaque_state=self.transceiver.offer(seq) if held else None)

    def expire(self) -> None:
        """Free the blocks of offers nobody fetched in time (engine thread)."""
        for seq in self.transceiver.expired():
            self.engine.release(seq)

    def stats(self) -> dict[str, Any]:
        """``kvTransferStats`` of ``LLM.get_stats``: offers held, transfers received and their total seconds."""
        with self._lock:
            return {"numHeldRequests": self.transceiver.num_offers, "numTransfers": self.num_transfers,
                    "transferSeconds": self.transfer_s}
