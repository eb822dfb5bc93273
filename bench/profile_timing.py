"""Paired, interleaved timing of autoregressive and speculative decoding through the backend contract.

What the tool measures itself (``perf_counter`` around each call and in the decoders' hooks):

* ``wall``: the whole call (prefill included);
* ``first``: from the call to the end of the first round (speculative: the first ``on_round`` call) or step
  (AR: the first ``on_step`` call), i.e. prefill plus one round or step;
* ``decode_seconds = wall - first`` over ``decode_tokens`` (the tokens emitted after that first round or
  step): seconds per token, the figure every speedup is computed from (prefill and the first round are
  timed apart and reported as ``first``). A backend that never calls ``on_round`` (the contract allows it
  without ``cache``) cannot be timed that way: then every run of the profile, AR included, is timed as a
  *whole call* (prefill included, all tokens), and the report says so.

What the backend reports (only when its round records carry ``seconds``: ``specdec_ref.contract.Decoder``, "Phase
timings"): per-phase seconds (prefill, draft, verify, repair, other), summed over the distinct round dicts of a call.

Order: one warm-up call per variant (dropped), then for every repeat and every unit (a prompt, or a group of
B prompts decoded together) every variant back to back, the order rotated by repeat and unit; sampling
seeds are shared by the variants of a (unit, repeat). The baseline is the reference's batched AR on the
lean static-cache forward (:func:`specdec_ref.decode.batched_autoregressive_decode` with
``make_cache=fastest_cache``), the same target model as the backend's.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from specdec_ref.contract import Request
from specdec_ref.decode import batched_autoregressive_decode
from specdec_ref.static_cache import fastest_cache

from .profile_memory import cache_bytes

__all__ = ["CLOCK", "Run", "Variant", "reference_ar", "run_call", "run_paired", "by_unit", "acceptance_by_position"]

#: The tool's clock (seconds). Tests replace it with a virtual clock that fake decoders advance by known costs.
CLOCK: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class Variant:
    """``k=None``: the AR baseline; otherwise the backend's speculative decoding with ``k`` drafts per round."""

    k: int | None

    @property
    def label(self) -> str:
        return "ar" if self.k is None else f"spec k={self.k}"


@dataclass
class Run:
    """One timed call (module docstring for which figures are measured and which reported)."""

    variant: Variant
    unit: int
    repeat: int
    wall: float
    first: float | None  # None: the backend called no on_round
    tokens: list[list[int]]
    after_first_tokens: int
    rounds: int  # batch rounds (spec) or steps (AR), the first one included
    records: list = field(default_factory=list, repr=False)  # the speculative rounds' RoundRecords, every row
    reported: dict | None = None  # backend-reported phase seconds of the whole call (None: not reported)
    reported_decode: dict | None = None  # the same over the rounds after the first
    caches: dict | None = None  # cache bytes at the last round (warm-up calls only)
    whole: bool = False  # timed as a whole call (module docstring)

    @property
    def decode_seconds(self) -> float:
        return self.wall if self.whole else self.wall - self.first

    @property
    def decode_tokens(self) -> int:
        return sum(len(t) for t in self.tokens) if self.whole else self.after_first_tokens

    @property
    def batch(self) -> int:
        return len(self.tokens)

    @property
    def per_token(self) -> float:
        """Seconds per token of each row after the first round or step (measured): the batch's decode seconds over its
        decode tokens per row (B = 1: plain seconds per token; a target forward serves every row)."""
        return self.decode_seconds / (self.decode_tokens / self.batch)

    @property
    def tokens_per_batch_round(self) -> float:
        """Decode tokens per row per batch round (below the rows' mean when rows finish in different rounds)."""
        return self.decode_tokens / self.batch / self.decode_rounds

    @property
    def decode_rounds(self) -> int:
        return self.rounds if self.whole else self.rounds - 1


def _requests(prompts: Sequence[torch.Tensor], new_tokens: int, sampling, seeds: Sequence[int] | None) -> list[Request]:
    return [
        Request(prompt=p, max_new_tokens=new_tokens, sampling=sampling, eos_ids=None, seed=None if seeds is None else seeds[i])
        for i, p in enumerate(prompts)
    ]


def _sum_phases(dicts: list[dict]) -> dict:
    out: dict[str, float] = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0.0) + value
    return out


def reference_ar(target, requests: list[Request], on_step: Callable[[int], None]) -> list:
    """The default baseline: the reference's batched AR on the lean static-cache forward."""
    return batched_autoregressive_decode(target, requests, make_cache=fastest_cache, on_step=on_step)


def run_call(backend, target, draft, variant: Variant, prompts: Sequence[torch.Tensor], *, new_tokens: int, sampling,
             seeds: Sequence[int] | None, unit: int = 0, repeat: int = 0, capture_caches: bool = False,
             baseline: Callable = reference_ar) -> Run:
    """One decode of ``prompts`` (B = ``len(prompts)``) by ``variant``, timed (module docstring); ``baseline(target,
    requests, on_step)`` decodes the AR variant and calls ``on_step`` after every step."""
    clock = CLOCK
    stamps: list[float] = []
    records: list = []
    caches: dict = {}
    requests = _requests(prompts, new_tokens, sampling, seeds)
    if variant.k is None:
        def on_step(step: int) -> None:
            if not stamps:
                stamps.append(clock())

        if capture_caches and baseline is reference_ar:  # an untimed probe: the bytes a lean cache for this batch holds
            from specdec_ref.row_cache import RowCaches

            probe = RowCaches(fastest_cache(target, batch_size=len(prompts), check_ids=False,
                                            max_length=max(p.shape[1] for p in prompts) + new_tokens))
            probe.prefill(list(prompts))
            caches["target"] = cache_bytes(probe.row(0)) if len(prompts) == 1 else _rows_bytes(probe)
        t0 = clock()
        results = baseline(target, requests, on_step)
        wall = clock() - t0
        rounds = max(len(r.tokens) for r in results)
        decode_tokens = sum(len(r.tokens) for r in results) - sum(1 for r in results if r.tokens)
        return Run(variant, unit, repeat, wall, stamps[0] - t0, [list(r.tokens) for r in results], decode_tokens, rounds,
                   caches=caches or None)

    def on_round(record, target_cache, draft_cache) -> None:
        if not stamps:
            stamps.append(clock())
        records.append(record)
        if capture_caches:
            caches["target"] = cache_bytes(target_cache)
            caches["draft"] = cache_bytes(draft_cache)

    batched = len(prompts) > 1 or not backend.capabilities.decoder
    t0 = clock()
    if batched:
        results = backend.decode_batch(target, draft, requests, k=variant.k, on_round=on_round)
    else:
        gen = None if seeds is None else torch.Generator().manual_seed(seeds[0])
        results = [backend.decode(target, draft, prompts[0], k=variant.k, max_new_tokens=new_tokens, sampling=sampling,
                                  eos_id=None, generator=gen, on_round=on_round)]
    wall = clock() - t0
    records = [rec for res in results for rec in res.rounds] or records
    rounds = max(len(r.rounds) for r in results)
    decode_tokens = sum(rec.emitted for rec in records if rec.round >= 1)
    dicts = {id(rec.seconds): rec for rec in records if rec.seconds is not None}
    reported = reported_decode = None
    if dicts:
        reported = _sum_phases([rec.seconds for rec in dicts.values()])
        reported_decode = _sum_phases([rec.seconds for rec in dicts.values() if rec.round >= 1])
        reported_decode.pop("prefill", None)
    return Run(variant, unit, repeat, wall, stamps[0] - t0 if stamps else None, [list(r.tokens) for r in results], decode_tokens,
               rounds, records=records, reported=reported, reported_decode=reported_decode, caches=caches or None,
               whole=not stamps)


def _rows_bytes(rows) -> dict:
    """Bytes of a multi-row lean cache: its whole buffers (valid = up to the longest row)."""
    return cache_bytes(rows.cache)


def run_paired(backend, target, draft, ks: Sequence[int], units: Sequence[Sequence[torch.Tensor]], *, new_tokens: int,
               sampling, repeats: int, seed: int = 0, log: Callable[[str], None] | None = None,
               baseline: Callable = reference_ar) -> dict[str, list[Run]]:
    """Warm-up then ``repeats`` interleaved repeats of AR and every ``k`` on every unit (module docstring).

    Returns ``{"warmup": [...], label: [Run per (repeat, unit)], ...}``; timed runs in (repeat, unit) order."""
    variants = [Variant(None)] + [Variant(k) for k in ks]
    sampled = not sampling.greedy

    def seeds(u: int, r: int):
        return [seed * 1_000_003 + (r + 2) * 10_007 + u * 101 + b for b in range(len(units[u]))] if sampled else None

    out: dict[str, list[Run]] = {"warmup": []}
    for v in variants:  # warm-up, dropped: allocations, first-call costs; it also reads the caches' bytes
        out["warmup"].append(run_call(backend, target, draft, v, units[0], new_tokens=new_tokens, sampling=sampling,
                                      seeds=seeds(0, -1), capture_caches=True, baseline=baseline))
        out[v.label] = []
    for r in range(repeats):
        for u, prompts in enumerate(units):
            shift = (r + u) % len(variants)
            for v in variants[shift:] + variants[:shift]:
                out[v.label].append(run_call(backend, target, draft, v, prompts, new_tokens=new_tokens, sampling=sampling,
                                             seeds=seeds(u, r), unit=u, repeat=r, baseline=baseline))
        if log:
            log(f"  repeat {r + 1}/{repeats} done")
    if any(run.first is None for runs in out.values() for run in runs):  # no on_round: everything as whole calls
        for runs in out.values():
            for run in runs:
                run.whole = True
    return out


def by_unit(runs: Sequence[Run], units: int, value: Callable[[Run], float]) -> list[list[float]]:
    """``value(run)`` indexed [unit][repeat]."""
    grid: list[list[float]] = [[] for _ in range(units)]
    for run in sorted(runs, key=lambda x: (x.unit, x.repeat)):
        grid[run.unit].append(value(run))
    return grid


def acceptance_by_position(runs: Sequence[Run]) -> dict:
    """Measured acceptance of the rounds of ``runs``, per draft position and overall.

    ``conditional[j-1]`` = P(draft j accepted | drafts 1..j-1 accepted) over rounds that proposed >= j drafts;
    ``tokens_per_round`` = mean of ``accepted + 1`` (what a round emits before a max_new_tokens cut);
    ``full`` = fraction of rounds that accepted every draft (those feed d_k to the draft in the repair)."""
    reached: dict[int, int] = {}
    taken: dict[int, int] = {}
    rounds = full = accepted = proposed = 0
    for run in runs:
        for rec in run.records:
            if rec.proposed <= 0:
                continue
            rounds += 1
            full += rec.accepted == rec.proposed
            accepted += rec.accepted
            proposed += rec.proposed
            for j in range(1, rec.proposed + 1):
                if rec.accepted >= j - 1:
                    reached[j] = reached.get(j, 0) + 1
                    taken[j] = taken.get(j, 0) + (rec.accepted >= j)
    positions = sorted(reached)
    return {
        "conditional": [taken[j] / reached[j] for j in positions],
        "reached": [reached[j] for j in positions],
        "rounds": rounds,
        "tokens_per_round": (accepted + rounds) / rounds if rounds else None,
        "full": full / rounds if rounds else None,
        "alpha": accepted / proposed if proposed else None,
    }


def log_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
