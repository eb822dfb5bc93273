"""The reference decoders: plain autoregressive (the oracle) and speculative decoding, batched.

Both decode a *batch of requests* (:class:`~specdec_ref.contract.Request`): each has its own prompt
(any length), :class:`SamplingConfig` (history-dependent settings included, :mod:`specdec_ref.history`),
``max_new_tokens``, EOS ids and generator; the batch-1 functions are the one-request case of the same
code. Every row keeps its own cache lengths (:class:`~specdec_ref.row_cache.RowCaches`); finished
requests leave the batch at the end of the round in which they stop.

Speculative round, for every row at once, with ``C_b`` committed tokens in row ``b`` of which the last
one is *pending* (committed but not yet fed to either cache):

1. the draft feeds the pending tokens and proposes ``d_1..d_k`` per row, sampling each from
   ``q_i``, the draft's logits processed with the row's settings on the history ``G + d_1..d_{i-1}``
   (``k`` draft calls for the batch);
2. the target feeds ``[pending, d_1..d_k]`` in one call; its rows 0..k are processed the same way
   (row ``i`` on ``G + d_1..d_i``: it judges ``d_{i+1}``; docs/algorithm.md);
3. the verifier returns each row's ``m`` and emitted tokens; EOS ends the row's generation right
   after it, its ``max_new_tokens`` is never exceeded;
4. repair, per row: both caches keep exactly the committed tokens minus the new pending one; rows
   that accepted all ``k`` drafts also feed ``d_k`` to the draft (one extra draft call for those rows).
   The sampling history advances by the committed tokens only, so drafts never leak into it.

Every round drafts exactly ``k`` tokens per row (the emitted tokens are cut at ``max_new_tokens``), so a
row's random draws depend on its own request only: a seeded request decodes the same alone or in any
batch. (``k`` shrinks only where a row would write past the models' max positions.)

Invariant after every round, per row: ``target_len == draft_len == committed_len - 1``; nothing after
an EOS is ever fed to either cache.

Host synchronisation: one per round for the whole batch (reading the emitted tokens); none per drafted
token. Acceptance is decided on the device by :mod:`specdec_ref.verify`.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from .cache import ModelCache
from .contract import PAD_TOKEN, DecodeResult, NotSupportedError, Request, RoundHook, RoundRecord
from .draws import choose_rows, row_generators as _row_generators
from .history import SamplingState, constant, warp_rows
from .models import model_dims
from .proposers import Proposer, open_proposer, roll_back_draft
from .row_cache import RowCaches
from .static_cache import fastest_cache
from .decode_inputs import _Batch, _validate_decode_args, validate_requests
from .verify import BlockVerifier, verify_block
from .warp import GREEDY, SamplingConfig

def open_caches(make_cache, make_draft_cache, target, draft, prompt: torch.Tensor, needed: int, result: DecodeResult):
    """Target and draft caches sized for ``needed`` positions (capped at each model's), holding the prompt but its
    last token: that one is the first *pending* token, fed at the start of the first round."""
    t = prompt.shape[1]
    target_cache = make_cache(target, check_ids=False, max_length=min(needed, model_dims(target)["max_positions"] or needed))
    draft_cache = make_draft_cache(draft, check_ids=False, max_length=min(needed, model_dims(draft)["max_positions"] or needed))
    if t > 1:
        target_cache.feed(prompt[:, :-1])
        draft_cache.feed(prompt[:, :-1])
        result.target_calls += 1
        result.draft_calls += 1
    target_cache.commit(t - 1)
    draft_cache.commit(t - 1)
    return target_cache, draft_cache


def end_round(result: DecodeResult, on_round: RoundHook | None, target_cache, draft_cache, *, start: int, proposed: int,
              accepted: int, emitted: int, committed: int, hit_eos: bool, row: int = 0, seconds: dict | None = None,
              drafts: list[int] | None = None, parents: list[int] | None = None,
              draft_probs: list[float] | None = None) -> bool:
    """Record a finished round (its :class:`RoundRecord` with the caches' lengths after the repair, the round's
    phase ``seconds``, if timed, and what it drafted), call ``on_round``, and mark an EOS finish; True when generation
    ends here."""
    record = RoundRecord(
        round=len(result.rounds),
        start=start,
        proposed=proposed,
        accepted=accepted,
        emitted=emitted,
        target_len=target_cache.tentative_length,
        draft_len=draft_cache.tentative_length,
        committed_len=committed,
        target_calls=result.target_calls,
        draft_calls=result.draft_calls,
        row=row,
        seconds=seconds,
        drafts=drafts,
        parents=parents,
        draft_probs=draft_probs,
    )
    result.rounds.append(record)
    if on_round is not None:
        on_round(record, target_cache, draft_cache)
    if hit_eos:
        result.finished_by = "eos"
    return hit_eos


def _truncate(emitted: list[int], eos_id) -> tuple[list[int], bool]:
    """``emitted`` cut right after its first EOS (``eos_id``: an id, a collection of ids, or None); True if cut."""
    stops = () if eos_id is None else (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
    for i, token in enumerate(emitted):
        if token in stops:
            return emitted[: i + 1], True
    return emitted, False


def _open_row_caches(make_cache, model, batch: _Batch, extra: int, tokens: Sequence[list[int]],
                     capture: tuple = ()) -> tuple[RowCaches, bool]:
    """A cache of the batch's rows with every prompt but its last token written; ``tokens``: the prompts as host lists
    (already read for the sampling state: rows with the same prompt share its prefill without another read).
    ``capture``: the hidden states a proposer reads (the cache keeps them from every forward, the prefill's too)."""
    needed = max(p.shape[1] + n for p, n in zip(batch.prompts, batch.max_new)) + extra
    limit = model_dims(model)["max_positions"] or needed
    cache = RowCaches(make_cache(model, batch_size=len(batch), check_ids=False, max_length=min(needed, limit)))
    if capture:
        if not hasattr(cache.cache, "features"):
            raise NotSupportedError(f"a proposer reading the target's hidden states needs the lean forward (llama / "
                                    f"qwen2), not {type(cache.cache).__name__}")
        cache.cache.capture = tuple(capture)
    return cache, cache.prefill(batch.prompts, tokens)


@torch.inference_mode()  # no autograd bookkeeping on the loop's small ops (results are host lists)
def batched_autoregressive_decode(
    target, requests: Sequence[Request], *, make_cache: Callable[..., ModelCache] = ModelCache,
    on_step: Callable[[int], None] | None = None,
) -> list[DecodeResult]:
    """Plain decoding of every request from its processed target logits: the oracle speculative decoding must equal.

    One target call per step for the batch; a row's next token depends on its own history and generator only.
    As the oracle it runs the transformers forward (``ModelCache``; batches need ``fastest_cache``).
    ``on_step(step)`` (optional) runs after every step's tokens are read back (a profile's clock; it sees nothing else).
    """
    batch = validate_requests(target, None, requests, 1)
    results = [DecodeResult(tokens=[], prompt_len=p.shape[1], finished_by="max_new_tokens") for p in batch.prompts]
    live = [i for i in range(len(batch)) if batch.max_new[i] > 0]
    if not live:
        return results
    sub = batch.rows(live)
    vocab = model_dims(target)["vocab_size"]
    tokens = sub.tokens
    state = SamplingState(tokens, sub.configs, sub.eos, vocab, sub.prompts[0].device)
    cache, fed = _open_row_caches(make_cache, target, sub, 0, tokens)
    pending = sub.pending()
    calls = int(fed)  # the prompts' prefill, when any prompt has more than one token
    while live:
        logits = cache.feed(pending)
        calls += 1
        probs = warp_rows(logits, sub.configs, state)[:, -1]
        token = choose_rows(probs, sub.configs, _row_generators(sub.generators))
        values = token.tolist()  # the one host sync of the step
        state.commit(token[:, None], torch.ones_like(token))
        keep = []
        for j, (i, value) in enumerate(zip(live, values)):
            res = results[i]
            res.tokens.append(value)
            res.host_syncs += 1
            res.target_calls = calls
            if value in sub.eos[j]:
                res.finished_by = "eos"
            elif len(res.tokens) < sub.max_new[j]:
                keep.append(j)
        cache.commit(cache.tentative)
        if len(keep) < len(live):
            live = [live[j] for j in keep]
            sub.keep(keep)
            state.select(keep)
            cache.select(keep)
            token = token[keep] if keep else token[:0]
        pending = token[:, None]
        if on_step is not None:
            on_step(calls - int(fed) - 1)
    return results


def autoregressive_decode(
    target,
    prompt,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    make_cache: Callable[..., ModelCache] = ModelCache,
    on_step: Callable[[int], None] | None = None,
) -> DecodeResult:
    """Plain decoding from the processed target logits: the oracle speculative decoding must equal (one request of
    :func:`batched_autoregressive_decode`; benchmarks may pass ``make_cache=fastest_cache`` and ``on_step``)."""
    request = Request(prompt=prompt, max_new_tokens=max_new_tokens, sampling=sampling, eos_ids=eos_id, generator=generator)
    _validate_decode_args(target, None, prompt, 1, max_new_tokens, eos_id, sampling, history_ok=True)
    return batched_autoregressive_decode(target, [request], make_cache=make_cache, on_step=on_step)[0]


class _PhaseClock:
    """Wall time by phase: ``round``, the current round's seconds (``draft``, ``verify``, ``repair``, ``other``; the
    first round's also ``prefill``), a new dict each round since the round's records keep it (``other`` is written
    after ``on_round`` saw them); ``totals``, the decode's ``prefill``, ``draft``, ``verify``, ``repair``. Always on:
    a few clock reads per round, next to forwards of ~0.1 ms and more."""

    def __init__(self):
        self.totals = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "repair": 0.0}
        self.round: dict = {}
        self._tick = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the previous lap is this round's ``phase``."""
        now = time.perf_counter()
        self.round[phase] = now - self._tick
        self._tick = now

    def prefill_done(self) -> None:
        self.lap("prefill")
        self.totals["prefill"] += self.round["prefill"]

    def start_round(self) -> None:
        self.round.update(draft=0.0, verify=0.0, repair=0.0, other=0.0)

    def end_round(self) -> None:
        for phase in ("draft", "verify", "repair"):
            self.totals[phase] += self.round[phase]
        self.round = {}


class _LiveRows:
    """The rows still decoding, in batch order: their request indices, committed lengths (prompt and emitted tokens)
    and per-row settings (``batch``); :meth:`keep` drops the others here and in every per-row object given."""

    def __init__(self, requests: list[int], batch: _Batch):
        self.requests = requests
        self.batch = batch
        self.committed = [len(t) for t in batch.tokens]

    def keep(self, stay: list[int], *per_row) -> None:
        """Keep the rows at positions ``stay`` (the sampling state, caches and proposer too: ``x.select(stay)``)."""
        self.requests = [self.requests[j] for j in stay]
        self.committed = [self.committed[j] for j in stay]
        self.batch.keep(stay)
        for part in per_row:
            part.select(stay)


class SpeculativeDecoder:
    """The reference speculative decoder, batched; one overridable method per step (mutants override one).

    Caches default to :func:`~specdec_ref.static_cache.fastest_cache`: the static-buffer lean forward for
    Llama/Qwen2 models (any batch), the transformers ``DynamicCache`` adapter otherwise (one request).
    """

    def __init__(
        self,
        verifier: BlockVerifier = verify_block,
        make_cache: Callable[..., ModelCache] = fastest_cache,
        make_draft_cache: Callable[..., ModelCache] | None = None,
    ):
        self.verifier = verifier
        self.sampling_state = SamplingState  # the history-dependent settings' per-row state (its class)
        self.make_cache = make_cache
        self.make_draft_cache = make_draft_cache or make_cache

    # -- steps -------------------------------------------------------------------------
    def draft_probs(self, logits: torch.Tensor, configs, state: SamplingState, drafts: torch.Tensor):
        """(distribution the draft samples from, distribution reported to the verifier as q) for the next draft of
        every row: ``logits [B, 1, V]`` processed on the history ``G + drafts`` (``drafts [B, i]``)."""
        q = warp_rows(logits, configs, state, drafts)[:, -1]
        return q, q

    def target_rows(self, logits: torch.Tensor, configs, state: SamplingState, drafts: torch.Tensor) -> torch.Tensor:
        """Target rows 0..k from the block forward of ``[pending, d_1..d_k]``: row i judges d_{i+1}, processed on
        the history ``G + d_1..d_i``."""
        return warp_rows(logits, configs, state, drafts)

    def judge(self, drafts: torch.Tensor, qs: torch.Tensor, rows: torch.Tensor, configs, generator):
        """The verifier on the batch: greedy verification when every row is greedy; in a mixed batch the greedy rows
        are judged as one-hot target and draft rows (accept while the draft is the argmax; the argmax replaces)."""
        greedy = [c.greedy for c in configs]
        if all(greedy):
            return self.verifier(drafts, None, rows, generator=generator, validate=False)
        if any(greedy):
            vocab = rows.shape[-1]
            mask = constant(tuple(greedy), torch.bool, rows.device)[:, None, None]
            rows = torch.where(mask, torch.nn.functional.one_hot(rows.argmax(-1), vocab).to(rows.dtype), rows)
            qs = torch.where(mask, torch.nn.functional.one_hot(drafts, vocab).to(qs.dtype), qs)
        return self.verifier(drafts, qs, rows, generator=generator, validate=False)

    def judge_counts(self, drafts: torch.Tensor, qs, rows: torch.Tensor, configs, generators: list, counts):
        """:meth:`judge` for proposals of per-row lengths (``counts``; None: every row proposed all ``k``). ``qs=None``
        marks one-hot drafts (judged against ``q = one_hot(d)``). Rows are judged in groups of equal length, each row on
        its own drafts and target rows ``0..count`` (so a short proposal gets its bonus from its own last row); a row
        that proposed nothing samples from row 0. Returns ``m [B]`` and ``tokens [B, k + 1]`` (``PAD_TOKEN`` after)."""
        k = drafts.shape[1]
        if qs is None and not all(c.greedy for c in configs):
            qs = torch.nn.functional.one_hot(drafts, rows.shape[-1]).to(rows.dtype)
        if counts is None or all(c == k for c in counts):
            return self.judge(drafts, qs, rows, configs, self.row_generators(generators))
        m = torch.zeros(len(counts), dtype=torch.long, device=drafts.device)
        tokens = torch.full((len(counts), k + 1), PAD_TOKEN, dtype=torch.long, device=drafts.device)
        for c in sorted(set(counts)):
            idx = [b for b, n in enumerate(counts) if n == c]
            sel = torch.tensor(idx, dtype=torch.long, device=drafts.device)
            part = [configs[b] for b in idx]
            gen = _row_generators(generators, idx)
            if c == 0:
                tokens[sel, 0] = choose_rows(rows[sel, 0], part, gen)
                continue
            sub_m, sub_tokens = self.judge(drafts[sel, :c], None if qs is None else qs[sel, :c], rows[sel, :c + 1], part, gen)
            m[sel] = sub_m
            tokens[sel, :c + 1] = sub_tokens
        return m, tokens

    def repair(self, target_cache: RowCaches, draft_cache: RowCaches, drafts: torch.Tensor, new_lens: list[int],
               fed_all: list[bool]) -> int:
        """Make both caches hold exactly each row's committed tokens minus its new pending one (``new_lens``);
        returns the draft calls spent (feeding ``d_k`` to rows that accepted every draft, which never fed it)."""
        target_cache.commit(new_lens)
        return self.repair_draft(draft_cache, drafts, new_lens, fed_all)

    def repair_draft(self, draft_cache: RowCaches, drafts: torch.Tensor, new_lens: list[int], fed_all: list[bool]) -> int:
        """The draft's half of :meth:`repair`: feed ``d_k`` to the rows that accepted every draft, then roll back
        (a proposer other than a draft model rolls its own state back: :meth:`Proposer.repair`)."""
        if isinstance(draft_cache, Proposer):
            return draft_cache.repair(drafts, new_lens, fed_all)
        return roll_back_draft(draft_cache, drafts, new_lens, fed_all)

    def kept_in_cache(self, emitted: list[int], untruncated: list[int]) -> int:
        """How many of this round's tokens the caches must describe: the committed ones, never any after EOS."""
        return len(emitted)

    def finished(self, emitted_total: int, max_new: int, hit_eos: bool) -> bool:
        """Whether a row stops after this round: EOS, or ``max_new_tokens`` reached."""
        return hit_eos or emitted_total >= max_new

    def row_generators(self, generators: list) -> torch.Generator | list | None:
        """The ``generator`` argument of this round's sampling calls: each live row's own generator (a list; the
        generator itself for one row), so a row's draws never depend on its neighbours."""
        return _row_generators(generators)

    def advance_history(self, state: SamplingState, drafts: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor) -> None:
        """The sampling history after a round: each row's committed tokens (``tokens[b, :keep[b]]``) join it; the
        rejected drafts never do."""
        state.commit(tokens, keep)

    def draft_room(self, k: int, limit: int, starts: list[int]) -> int:
        """Drafts this round: ``k``, or fewer when the row nearest the models' position limit has less room (0: a
        plain target step); no row ever writes past the models' positions."""
        return min(k, limit - max(starts))

    def leave(self, live: list[int], done: list[bool]) -> list[int]:
        """Positions (in the live batch) of the rows that stay for the next round, in order."""
        return [j for j, d in enumerate(done) if not d]

    def verify_round(self, target_cache: RowCaches, pending: torch.Tensor, drafts: torch.Tensor, qs, counts,
                     batch: _Batch, state: SamplingState, generator, plain: bool):
        """The target's forward of ``[pending, drafts]`` and the verdict on it: ``m [B]`` and the emitted ``tokens
        [B, n]``; a ``plain`` round (no drafts) samples one token per row from the pending tokens' target row."""
        if plain:
            rows = self.target_rows(target_cache.feed(pending), batch.configs, state, drafts)
            tokens = choose_rows(rows[:, -1], batch.configs, generator)[:, None]
            return torch.zeros_like(tokens[:, 0]), tokens
        logits = target_cache.feed(torch.cat([pending, drafts], 1))
        rows = self.target_rows(logits, batch.configs, state, drafts)
        return self.judge_counts(drafts, qs, rows, batch.configs, batch.generators, counts)

    # -- loop ----------------------------------------------------------------------------
    @torch.inference_mode()  # no autograd bookkeeping on the loop's small ops (results are host lists)
    def decode_batch(
        self,
        target,
        draft,
        requests: Sequence[Request],
        *,
        k: int,
        on_round: RoundHook | None = None,
        timed: bool = False,
    ) -> list[DecodeResult]:
        """Speculative decoding of every request (module docstring); one :class:`DecodeResult` per request, in order.

        ``on_round(record, target_cache, draft_cache)`` runs after every round for every row still in the batch,
        with that row's caches (``record.row`` is its request index). Every record carries the round's phase seconds
        (``record.seconds``: :class:`~specdec_ref.contract.Decoder`, "Phase timings"; complete when this returns);
        ``timed`` also puts their totals (prefill, draft, verify, repair) in every result's ``seconds``."""
        batch = validate_requests(target, draft, requests, k)
        results = [DecodeResult(tokens=[], prompt_len=p.shape[1], finished_by="max_new_tokens") for p in batch.prompts]
        live = [i for i in range(len(batch)) if batch.max_new[i] > 0]
        if not live:
            return results
        clock = _PhaseClock()
        live = _LiveRows(live, batch.rows(live))
        sub = live.batch
        state = self.sampling_state(sub.tokens, sub.configs, sub.eos, model_dims(target)["vocab_size"], sub.prompts[0].device)
        target_cache, fed = _open_row_caches(self.make_cache, target, sub, k, sub.tokens, getattr(draft, "target_capture", ()))
        proposer = open_proposer(self, target, draft, sub, k, sub.tokens, target_cache,
                                 lambda make, model: _open_row_caches(make, model, sub, k, sub.tokens))
        draft_cache = proposer.draft_cache
        limit = min(target_cache.cache.max_positions or 1 << 30, proposer.max_positions or 1 << 30)
        calls = {"target": int(fed), "draft": int(fed) if proposer.kind == "draft_model" else 0}
        pending = sub.pending()
        clock.prefill_done()
        while live.requests:
            clock.start_round()
            starts = list(live.committed)
            generator = self.row_generators(sub.generators)
            # 1. draft: k_round tokens per row (0: no room for drafts, or a head before its first target forward)
            k_round = self.draft_room(k, limit, starts) if proposer.ready() else 0
            if k_round == 0:
                calls["draft"] += proposer.plain_step(pending)
                drafts, qs, counts = pending[:, :0], None, None
            else:
                drafts, qs, counts, spent = proposer.propose(pending, k_round, sub.configs, state, generator)
                calls["draft"] += spent
            clock.lap("draft")
            # 2. verify: one target forward of [pending, drafts], the verifier's m and tokens, one host read
            m, tokens = self.verify_round(target_cache, pending, drafts, qs, counts, sub, state, generator, k_round == 0)
            if proposer.target_capture:
                proposer.observe(target_cache.cache.features(), [s - 1 for s in starts])
            calls["target"] += 1
            out = tokens.shape[1]
            flat = torch.cat([m[:, None], tokens, drafts], 1).tolist()  # the one host sync of the round (drafts too)
            clock.lap("verify")
            # 3. commit: each row's emitted tokens (cut at EOS and max_new_tokens), both caches repaired to them
            new_lens, fed_all, emitted_counts, done, finals = [], [], [], [], []
            for j, i in enumerate(live.requests):
                accepted, row, drafted = flat[j][0], flat[j][1 : 1 + out], flat[j][1 + out :]
                res = results[i]
                untruncated = [x for x in row if x >= 0][: sub.max_new[j] - len(res.tokens)]
                emitted, hit_eos = _truncate(untruncated, sub.eos[j])
                kept = self.kept_in_cache(emitted, untruncated)
                res.tokens.extend(emitted)
                res.host_syncs += 1
                live.committed[j] += len(emitted)
                new_lens.append(starts[j] + kept - 1)
                fed_all.append(k_round > 0 and kept == k_round + 1)
                proposer.commit_tokens(j, emitted)
                emitted_counts.append(len(emitted))
                done.append(self.finished(len(res.tokens), sub.max_new[j], hit_eos))
                finals.append((accepted, len(emitted), hit_eos, drafted[: k_round if counts is None else counts[j]]))
            calls["draft"] += self.repair(target_cache, draft_cache, drafts, new_lens, fed_all)
            keep_n = torch.tensor(emitted_counts, device=tokens.device)
            self.advance_history(state, drafts, tokens, keep_n)
            pending = tokens.gather(1, (keep_n - 1).clamp_min(0)[:, None])
            clock.lap("repair")
            # 4. report every row's round, then the finished rows leave the batch
            for j, i in enumerate(live.requests):
                res = results[i]
                res.target_calls, res.draft_calls = calls["target"], calls["draft"]
                accepted, n_emitted, hit_eos, drafted = finals[j]
                end_round(res, on_round, target_cache.row(j), draft_cache.row(j), start=starts[j], proposed=len(drafted),
                          accepted=accepted, emitted=n_emitted, committed=live.committed[j], hit_eos=hit_eos, row=i,
                          seconds=clock.round, drafts=drafted)
            stay = self.leave(live.requests, done)
            if len(stay) < len(live.requests):
                live.keep(stay, state, target_cache, proposer)
                pending = pending[stay] if stay else pending[:0]
            clock.lap("other")  # bookkeeping, on_round and rows leaving: after on_round saw the record
            clock.end_round()
        if timed:
            for res in results:
                res.seconds = dict(clock.totals)
        return results

    def decode(
        self,
        target,
        draft,
        prompt,
        *,
        k: int,
        max_new_tokens: int,
        sampling: SamplingConfig = GREEDY,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
        on_round: RoundHook | None = None,
        timed: bool = False,
    ) -> DecodeResult:
        """One request (batch 1): :meth:`decode_batch` with ``[Request(prompt, max_new_tokens, sampling, eos_id, generator)]``."""
        _validate_decode_args(target, draft, prompt, k, max_new_tokens, eos_id, sampling, history_ok=True)
        request = Request(prompt=prompt, max_new_tokens=max_new_tokens, sampling=sampling, eos_ids=eos_id, generator=generator)
        return self.decode_batch(target, draft, [request], k=k, on_round=on_round, timed=timed)[0]


def speculative_decode(target, draft, prompt, **kwargs) -> DecodeResult:
    """Speculative decoding with the reference verifier and cache (see :class:`SpeculativeDecoder`)."""
    return SpeculativeDecoder().decode(target, draft, prompt, **kwargs)


def batched_speculative_decode(target, draft, requests: Sequence[Request], *, k: int, **kwargs) -> list[DecodeResult]:
    """Batched speculative decoding with the reference verifier and caches (:meth:`SpeculativeDecoder.decode_batch`)."""
    return SpeculativeDecoder().decode_batch(target, draft, requests, k=k, **kwargs)
