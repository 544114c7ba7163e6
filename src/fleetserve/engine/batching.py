"""Continuous batching for the built-in engine.

Requests join and leave the running batch at step boundaries. KV memory for the batch is one preallocated
buffer per layer, `[slots, kv_heads, capacity, head_dim]`; all rows write their new token at a shared
position and each row keeps a validity mask, so a decode step reads views of the buffer (no per-step
concatenation). The capacity doubles when needed (amortised, rare) and rows are re-packed to the right when
the shared position runs out. Active rows stay packed in slots [0, B): a finished row's slot is filled by
the last row.

Prefill runs in chunks (`prefill_chunk` tokens) on its own batch-1 cache, one chunk between decode steps,
so a long prompt never stalls running decodes for its whole duration; alone, it goes in larger chunks
(`lone_prefill_chunk`). The prefix cache (engine -> L1 -> L2) is consulted first, exactly as in the serial path.
Cancellation frees a slot at the next step, and drops a prefill at its next chunk.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fleetserve.engine.runner import PREFILL_CHUNK, ModelRunner
from fleetserve.engine.sampling import choose_token
from fleetserve.engine.scheduler import Job, JobQueue
from fleetserve.engine.textstream import TextStream

log = logging.getLogger(__name__)


class SlotCache:
    """The batch's KV buffer, duck-typed as a transformers cache (`update`, `get_seq_length`)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, slots: int, dtype: torch.dtype,
                 capacity: int = 256):
        self.shape = (layers, slots, kv_heads, capacity, head_dim)
        self.k = torch.zeros(self.shape, dtype=dtype)
        self.v = torch.zeros(self.shape, dtype=dtype)
        self.valid = torch.zeros((slots, capacity), dtype=torch.bool)
        self.pos = 0  # the shared write position
        self.rows = 0  # active rows: slots [0, rows)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def _grow(self, needed: int) -> None:
        new = self.capacity
        while new < needed:
            new *= 2
        if new == self.capacity:
            return
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = torch.zeros(old.shape[:3] + (new,) + old.shape[4:], dtype=old.dtype)
            grown[:, :, :, : old.shape[3]] = old
            setattr(self, name, grown)
        valid = torch.zeros((self.valid.shape[0], new), dtype=torch.bool)
        valid[:, : self.valid.shape[1]] = self.valid
        self.valid = valid

    def repack(self) -> None:
        """Right-align every row's valid positions at the smallest shared position that holds them all."""
        counts = self.valid[: self.rows].sum(dim=1)
        target = int(counts.max()) if self.rows else 0
        for r in range(self.rows):
            idx = self.valid[r].nonzero().squeeze(1)
            n = idx.numel()
            k = self.k[:, r, :, idx].clone()
            v = self.v[:, r, :, idx].clone()
            self.valid[r].zero_()
            self.k[:, r, :, target - n: target] = k
            self.v[:, r, :, target - n: target] = v
            self.valid[r, target - n: target] = True
        self.pos = target

    def ensure_room(self, extra: int) -> None:
        if self.pos + extra <= self.capacity:
            return
        self.repack()
        self._grow(self.pos + extra)

    def admit(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
        """Place a prefilled sequence (per layer [kv_heads, L, head_dim]) in the next row; returns the row."""
        length = keys[0].shape[1]
        self.ensure_room(max(length - self.pos, 0) + 1)  # may re-pack the other rows (pos can shrink)
        self.pos = max(self.pos, length)
        self._grow(self.pos + 1)
        row = self.rows
        self.valid[row].zero_()
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.k[layer, row, :, self.pos - length: self.pos] = k
            self.v[layer, row, :, self.pos - length: self.pos] = v
        self.valid[row, self.pos - length: self.pos] = True
        self.rows += 1
        return row

    def remove(self, row: int) -> None:
        """Free `row`; the last row moves into it so active rows stay packed."""
        last = self.rows - 1
        if row != last:
            self.k[:, row] = self.k[:, last]
            self.v[:, row] = self.v[:, last]
            self.valid[row] = self.valid[last]
        self.valid[last].zero_()
        self.rows -= 1
        if self.rows == 0:
            self.pos = 0

    # --- the transformers cache protocol ------------------------------------------------------------------

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        b = key_states.shape[0]
        self.k[layer_idx, :b, :, self.pos] = key_states[:, :, 0]
        self.v[layer_idx, :b, :, self.pos] = value_states[:, :, 0]
        return self.k[layer_idx, :b, :, : self.pos + 1], self.v[layer_idx, :b, :, : self.pos + 1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.pos

    def step_mask(self) -> torch.Tensor:
        """Additive [B, 1, 1, pos + 1] mask: each row sees its own valid positions and the token being written.

        (An additive mask in the model dtype is measurably faster than a boolean one in CPU SDPA.)"""
        self.valid[: self.rows, self.pos] = True
        valid = self.valid[: self.rows, : self.pos + 1]
        mask = torch.zeros(valid.shape, dtype=self.k.dtype).masked_fill_(~valid, torch.finfo(self.k.dtype).min)
        return mask[:, None, None, :]


@dataclass
class Row:
    job: Job
    stream: TextStream
    length: int  # tokens whose KV is cached (the next token's position)
    last: int  # the token to feed next
    produced: int
    cached_tokens: int
    counts: dict[int, int] = field(default_factory=dict)
    generator: torch.Generator | None = None


@dataclass
class Prefill:
    job: Job
    cache: object
    done: int  # prompt tokens already in `cache`
    cached_tokens: int
    keys: list[int]


class BatchScheduler(JobQueue):
    """Same interface as SerialScheduler: submit jobs, `running`/`waiting` for the gauges."""

    def __init__(self, runner: ModelRunner, max_waiting: int = 256, on_token: Callable[[], None] | None = None,
                 max_batch: int = 8, prefill_chunk: int = 256, lone_prefill_chunk: int = PREFILL_CHUNK):
        self.runner = runner
        self.max_waiting = max_waiting
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        # alone, a prefill still goes in chunks this large: a client that hung up is seen between them (one pass
        # over a prompt near the context length went on for tens of seconds after it left, on CPU)
        self.lone_prefill_chunk = max(prefill_chunk, lone_prefill_chunk)
        self._count_token = on_token or (lambda: None)
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="batching", daemon=True)
        c = runner.model.config
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.slots = SlotCache(c.num_hidden_layers, kv_heads, head_dim, max_batch, runner.torch_dtype)
        self.rows: list[Row] = []
        self.prefill: Prefill | None = None
        self._stopping = False

    @property
    def running(self) -> int:
        return len(self.rows) + (1 if self.prefill else 0)

    def free_slots(self) -> int:
        return max(0, self.max_batch - self.running)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    # --- the loop ------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._stopping:
                try:
                    self._iteration()
                except Exception as exc:  # fail the affected requests, keep serving
                    log.exception("batch step failed")
                    for row in self.rows:
                        row.job.post("error", f"generation failed: {type(exc).__name__}")
                    if self.prefill:
                        self.prefill.job.post("error", f"generation failed: {type(exc).__name__}")
                    self.rows, self.prefill = [], None
                    self.slots.rows, self.slots.pos = 0, 0
                    self.slots.valid.zero_()

    def _iteration(self) -> None:
        self._drop_cancelled()
        if self.prefill is None and len(self.rows) < self.max_batch:
            idle = not self.rows
            try:
                job = self._queue.get() if idle else self._queue.get_nowait()
            except queue.Empty:
                job = None
            if job is None and idle:
                return  # stop() woke us
            if job is not None and not job.cancelled.is_set():
                self._isolated(job, self._start_prefill, job)
        if self.prefill is not None:
            self._isolated(self.prefill.job, self._prefill_chunk)
        if self.rows:
            self._decode_step()

    def _isolated(self, job: Job, step: Callable, *args) -> None:
        """Run one request's own work (prefix lookup, prefill, first sample); a failure fails that request only.

        Only the shared decode step can fail the whole batch (and `_loop` handles that)."""
        try:
            step(*args)
        except Exception as exc:
            log.exception("request failed in prefill")
            if self.prefill is not None and self.prefill.job is job:
                self.prefill = None
            job.post("error", f"generation failed: {type(exc).__name__}")

    def _drop_cancelled(self) -> None:
        for i in range(len(self.rows) - 1, -1, -1):
            if self.rows[i].job.cancelled.is_set():
                self._finish(i, "cancelled")
        if self.prefill and self.prefill.job.cancelled.is_set():
            self.prefill = None

    def _start_prefill(self, job: Job) -> None:
        cache, cached, keys = self.runner.cached_prefix(job.prompt_ids, job.root, job.tenant, job.prefetched)
        job.prefetched = None  # its bytes are blocks in the engine tier now: the job must not hold a second copy
        self.prefill = Prefill(job, cache, cached, cached, keys)

    def _prefill_chunk(self) -> None:
        p = self.prefill
        runner = self.runner
        ids = p.job.prompt_ids
        # small chunks when decodes wait behind the prefill; alone, larger ones (fewer passes), between which a
        # cancelled request is dropped (_iteration)
        end = min(len(ids), p.done + (self.prefill_chunk if self.rows else self.lone_prefill_chunk))
        out = runner.model(input_ids=torch.tensor([ids[p.done:end]]), cache=p.cache, use_cache=True,
                           logits_to_keep=1)
        p.cache, p.done = out.cache, end
        if end < len(ids):
            return
        job = p.job
        row = Row(job, TextStream(runner.decode, job.sampling.stop), len(ids), 0, 0, p.cached_tokens)
        if job.sampling.seed is not None:
            row.generator = torch.Generator().manual_seed(job.sampling.seed)
        runner.store_new_blocks(p.cache, p.keys, p.cached_tokens, p.job.tenant)
        accepted = self._accept(row, out.logits[0, -1])
        self.prefill = None  # only now: a failure above is this request's alone (see _isolated)
        if not accepted:
            return
        keys = [layer.keys[0] for layer in p.cache.layers]
        values = [layer.values[0] for layer in p.cache.layers]
        self.slots.admit(keys, values)
        self.rows.append(row)

    def _accept(self, row: Row, logits: torch.Tensor) -> bool:
        """Sample the next token for `row`; False (and the job finished) when the row is done."""
        job = row.job
        token = choose_token(logits, job.sampling, row.generator, row.counts)
        if token in self.runner.eos_ids and not job.sampling.ignore_eos:
            self._done(row, "stop")
            return False
        row.produced += 1
        row.counts[token] = row.counts.get(token, 0) + 1
        row.last = token
        self._count_token()
        delta = row.stream.push(token)
        job.post("token", delta)
        if row.stream.stopped:
            self._done(row, "stop")
            return False
        if row.produced >= job.max_new_tokens:
            self._done(row, "length")
            return False
        return True

    def _done(self, row: Row, reason: str) -> None:
        tail = row.stream.finish()
        if tail:
            row.job.post("token", tail)
        row.job.post("done", reason, len(row.job.prompt_ids), row.produced, row.cached_tokens)

    def _finish(self, index: int, reason: str) -> None:
        row = self.rows[index]
        self._finish_silent(index)
        if reason != "cancelled":
            self._done(row, reason)

    def _decode_step(self) -> None:
        s = self.slots
        s.ensure_room(1)
        mask = s.step_mask()
        inputs = torch.tensor([[r.last] for r in self.rows])
        positions = torch.tensor([[r.length] for r in self.rows])
        out = self.runner.model(input_ids=inputs, position_ids=positions, attention_mask=mask, cache=s,
                                use_cache=True, logits_to_keep=1)
        s.pos += 1
        finished = []
        for i, row in enumerate(self.rows):
            row.length += 1
            try:
                keep = self._accept(row, out.logits[i, -1])
            except Exception as exc:  # this row's own sampling or text: fail it alone, the batch goes on
                log.exception("request failed in decode")
                row.job.post("error", f"generation failed: {type(exc).__name__}")
                keep = False
            if not keep:
                finished.append(i)
        for i in reversed(finished):
            self._finish_silent(i)

    def _finish_silent(self, index: int) -> None:
        """Free a row whose job was already told it is done (or gone)."""
        self.rows.pop(index)
        # the slot of row `index` is refilled by the last row: keep `rows` in slot order
        self.slots.remove(index)
        if index < len(self.rows):
            self.rows.insert(index, self.rows.pop())
