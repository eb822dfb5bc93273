"""``specdec-bench batch``: batched speculative decoding vs batched AR on the same lean forward, B = 1, 8, 64.

Tokens/s of :meth:`specdec_ref.decode.SpeculativeDecoder.decode_batch` (k grid) and of
:func:`specdec_ref.decode.batched_autoregressive_decode` with ``make_cache=fastest_cache`` ("ar-lean", the
baseline: the same static-cache lean forward) on the shipped trained pair, greedy and sampling, the variants
interleaved within each repeat (rotating order). Next to the measured speedup, two predictions:

* Leviathan et al. (ICML 2023), :func:`leviathan_speedup`: ``S = (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))``
  with ``alpha`` the measured acceptance rate and ``c`` the measured cost ratio of one draft forward to one
  target forward of ``[B, 1]`` tokens at that B;
* refined, :func:`refined_speedup`: ``S' = E / (k c + r)`` with ``E`` the measured mean tokens per round and
  ``r`` the measured cost of a target forward of ``[B, k + 1]`` over one of ``[B, 1]``.

Forward costs are medians of :func:`specdec_bench.kit.time_calls` on the lean forward through
:class:`specdec_ref.row_cache.RowCaches` (the decoder's own dispatch), feeding then rolling back so the cache
stays at the prompt. Neither prediction counts per-round host work (warping, verification, the host sync,
repair): the ``rnd/fwd`` column (measured wall per batch round in target-forward units, against ``k c + r``)
shows it. Greedy rows must equal ar-lean token for token (exit status 1 otherwise). transformers' assisted
generation is probed at every B > 1 (it is batch-1 only in transformers 5.x; ``specdec-bench decoder`` times
it at B = 1).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers import GenerationConfig

from specdec_ref.contract import Request
from specdec_ref.decode import SpeculativeDecoder, batched_autoregressive_decode
from specdec_ref.adapters.hf_backends import pinned_draft_length
from specdec_ref.pretrained import CONTEXT_LENGTH, load_trained_pair, sample_prompts
from specdec_ref.row_cache import RowCaches
from specdec_ref.static_cache import fastest_cache
from specdec_ref.warp import GREEDY, SamplingConfig

from .decoder import _decoder_seed
from .kit import Column, Subcommand, choice_list, columns, fmt_float, int_list, load_average, percentile, time_calls


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """``E = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)`` (``k + 1`` at ``alpha = 1``): the expected
    tokens a round of ``k`` drafts emits when each draft is accepted with probability ``alpha`` (Leviathan et al.)."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    return sum(alpha**i for i in range(k + 1))


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. (ICML 2023), Theorem 3.8: the expected walltime improvement of speculative decoding,

    ``S = (1 - alpha^(k+1)) / ((1 - alpha) * (k * c + 1))``

    with ``alpha`` the acceptance rate, ``k`` drafts per round and ``c`` the cost of one draft forward over one
    target forward. ``alpha = 0`` gives ``1 / (k c + 1)``; ``alpha -> 1`` gives ``(k + 1) / (k c + 1)``. It assumes
    a target forward of ``k + 1`` tokens costs one of 1 token and no per-round overhead (see :func:`refined_speedup`).
    """
    return expected_tokens_per_round(alpha, k) / (k * c + 1.0)


def refined_speedup(tokens_per_round: float, k: int, c: float, r: float) -> float:
    """``S' = E / (k c + r)``: :func:`leviathan_speedup` with the measured mean tokens per round ``E`` and the measured
    cost ``r`` of a target forward of ``k + 1`` tokens over one of 1 token (both at the same batch size)."""
    return tokens_per_round / (k * c + r)


@dataclass(frozen=True)
class _Variant:
    k: int | None  # None: ar-lean

    @property
    def label(self) -> str:
        return "ar-lean" if self.k is None else f"spec k={self.k}"


def _gap(a, b):
    return None if a is None or b is None else a / b - 1.0


BATCH_COLUMNS = [
    *columns(mode="mode", batch="B", label="variant"),
    Column("tokens_per_s_median", "tok/s", fmt_float(0)),
    *columns(fmt_float(2), vs_ar_lean="x lean", tokens_per_target_call="tok/tgt"),
    Column("acceptance", "alpha", fmt_float(3)),
    Column("tokens_per_round", "tok/rnd", fmt_float(2)),
    *columns(fmt_float(3), cost_ratio="c", block_ratio="r"),
    *columns(fmt_float(2), leviathan_speedup="S", refined_speedup="S'"),
    *columns(lambda v: "-" if v is None else f"{100 * v:+.0f}%", gap_leviathan="gap S", gap_refined="gap S'"),
    *columns(fmt_float(2), round_cost="rnd/fwd", predicted_round_cost="kc+r"),
    Column("equals_ar_text", "= lean"),
]


def add_batch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int_list, default=[1, 8, 64], help="batch sizes B = rows decoded together (default 1,8,64)")
    p.add_argument("--mode", type=choice_list("greedy", "sampling"), default=["greedy", "sampling"],
                   help="greedy,sampling (default both; sampling = temperature 1, no top-k/top-p)")
    p.add_argument("--k", type=int_list, default=[2, 4], help="draft lengths (default 2,4)")
    p.add_argument("--new-tokens", type=int, default=64, help="new tokens per row, no EOS (default 64; prompt + new tokens <= 256)")
    p.add_argument("--prompt-length", type=int, default=32, help="prompt length in bytes (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats, variants interleaved in rotating order (default 3)")
    p.add_argument("--cost-seconds", type=float, default=0.2,
                   help="seconds per timed repeat of each single-forward cost measurement (c, r) (default 0.2)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="base seed: row b of repeat r gets its own seed (shared by the variants)")


def forward_seconds(model, prompts: list[torch.Tensor], n: int, *, repeats: int, min_seconds: float, max_length: int) -> float:
    """Median seconds of one lean forward of ``[B, n]`` tokens (B = ``len(prompts)``) on a cache holding each prompt
    but its last token, fed through :class:`RowCaches` as the decoders do, then rolled back (the length stays fixed)."""
    cache = RowCaches(fastest_cache(model, batch_size=len(prompts), check_ids=False, max_length=max_length))
    cache.prefill(prompts)
    lengths = list(cache.committed)
    ids = torch.cat([p[:, -1:] for p in prompts]).repeat(1, n)

    def step():
        cache.feed(ids)
        cache.commit(lengths)

    device = next(model.parameters()).device.type
    calls, seconds = time_calls(step, device, repeats=repeats, min_seconds=min_seconds, warmup_seconds=min_seconds / 4)
    return percentile([s / calls for s in seconds], 50)


def hf_assisted_batch_error(target, draft, prompts: list[torch.Tensor], k: int) -> str | None:
    """``None`` when ``target.generate(batch, assistant_model=draft)`` runs for ``len(prompts)`` rows (2 greedy tokens,
    untimed), else the exception as ``"Type: message"``."""
    ids = torch.cat(prompts)
    config = GenerationConfig(max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None)
    try:
        with pinned_draft_length(draft, k):
            target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, generation_config=config)
    except Exception as exc:  # noqa: BLE001 -- the point is to report whatever transformers raises
        return f"{type(exc).__name__}: {exc}"
    return None


def _batch_call(v: _Variant, target, draft, requests: list[Request], new_tokens: int) -> dict:
    """One batched decode: wall seconds, every row's tokens, and the batch's call and round counts.

    ``DecodeResult.target_calls`` is the batch's cumulative counter (one call serves every live row), so the batch's
    count is the largest over rows; both include the prefill forward. The batch's decode calls are therefore its
    rounds (spec: one target call per round) or steps (AR: one token per row per step)."""
    t0 = time.perf_counter()
    if v.k is None:
        results = batched_autoregressive_decode(target, requests, make_cache=fastest_cache)
    else:
        results = SpeculativeDecoder().decode_batch(target, draft, requests, k=v.k)
    seconds = time.perf_counter() - t0
    if any(len(res.tokens) != new_tokens for res in results):
        raise RuntimeError(f"{v.label}: a row generated {[len(res.tokens) for res in results]} tokens, expected {new_tokens}")
    target_calls = max(res.target_calls for res in results)
    rounds = [rec for res in results for rec in res.rounds]
    batch_calls = new_tokens if v.k is None else max(len(res.rounds) for res in results)
    if target_calls - batch_calls not in (0, 1):  # 1: the prefill forward
        raise RuntimeError(f"{v.label}: {target_calls} target calls for {batch_calls} rounds or steps")
    return dict(
        seconds=seconds,
        tokens=[list(res.tokens) for res in results],
        batch_calls=batch_calls,
        row_rounds=len(rounds),
        proposed=sum(rec.proposed for rec in rounds),
        accepted=sum(rec.accepted for rec in rounds),
        emitted=sum(rec.emitted for rec in rounds),
    )


def run_batch(args: argparse.Namespace) -> list[dict]:
    if args.prompt_length + args.new_tokens > CONTEXT_LENGTH or args.prompt_length + max(args.k, default=1) > CONTEXT_LENGTH:
        raise SystemExit(
            f"--prompt-length {args.prompt_length} + --new-tokens {args.new_tokens} (and + max k) exceeds the pair's context {CONTEXT_LENGTH}"
        )
    if min(args.k, default=0) < 1 or min(args.batch, default=0) < 1 or args.new_tokens < 1 or args.repeats < 1 or args.prompt_length < 1:
        raise SystemExit("--k, --batch, --new-tokens, --prompt-length and --repeats must be >= 1 (and non-empty)")
    variants = [_Variant(None)] + [_Variant(k) for k in args.k]
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    target, draft = load_trained_pair()
    all_prompts = sample_prompts(max(args.batch), length=args.prompt_length, seed=0)  # B rows: the first B of these
    max_length = min(args.prompt_length + max(args.k) + 1, CONTEXT_LENGTH)
    costs: dict[int, dict] = {}
    rows: list[dict] = []
    try:
        for mode in args.mode:
            sampling = GREEDY if mode == "greedy" else SamplingConfig(temperature=1.0)
            for batch in args.batch:
                prompts = all_prompts[:batch]
                if batch not in costs:  # forward costs and the transformers probe do not depend on the mode
                    timing = dict(repeats=args.repeats, min_seconds=args.cost_seconds, max_length=max_length)
                    costs[batch] = dict(
                        target1=forward_seconds(target, prompts, 1, **timing),
                        draft1=forward_seconds(draft, prompts, 1, **timing),
                        block={k: forward_seconds(target, prompts, k + 1, **timing) for k in args.k},
                        hf_error=hf_assisted_batch_error(target, draft, prompts, args.k[0]) if batch > 1 else None,
                    )

                def call(v: _Variant, r: int) -> dict:
                    requests = [
                        Request(prompt=p, max_new_tokens=args.new_tokens, sampling=sampling, eos_ids=None, seed=_decoder_seed(args.seed, r, b))
                        for b, p in enumerate(prompts)
                    ]
                    return _batch_call(v, target, draft, requests, args.new_tokens)

                for v in variants:  # warm-up: every variant once at this B (allocations, first-call costs)
                    call(v, -1)
                runs: dict[str, list[dict]] = {v.label: [] for v in variants}
                for r in range(args.repeats):
                    shift = r % len(variants)
                    for v in variants[shift:] + variants[:shift]:
                        runs[v.label].append(call(v, r))
                print(f"  [{mode} B={batch}] {args.repeats} repeats done", file=sys.stderr, flush=True)
                rows.extend(_batch_rows(mode, batch, variants, runs, costs[batch], args))
    finally:
        torch.set_num_threads(previous_threads)
    return rows


def _batch_rows(mode: str, batch: int, variants: list[_Variant], runs: dict[str, list[dict]], cost: dict, args) -> list[dict]:
    reference = runs["ar-lean"]
    c = cost["draft1"] / cost["target1"]
    load = load_average()
    rows = []
    for v in variants:
        reps = runs[v.label]
        tokens = sum(len(t) for x in reps for t in x["tokens"])
        rates = [sum(len(t) for t in x["tokens"]) / x["seconds"] for x in reps]
        batch_calls = sum(x["batch_calls"] for x in reps)
        row: dict[str, Any] = dict(
            mode=mode, batch=batch, variant="ar-lean" if v.k is None else "spec", k=v.k, label=v.label,
            prompt_length=args.prompt_length, new_tokens=args.new_tokens, repeats=len(reps), threads=args.threads,
            tokens_per_s=rates, tokens_per_s_median=percentile(rates, 50),
            tokens_per_target_call=tokens / batch_calls,
            target_forward_s=cost["target1"], draft_forward_s=cost["draft1"],
            round_cost=percentile([x["seconds"] / x["batch_calls"] / cost["target1"] for x in reps], 50),
            predicted_round_cost=1.0, load_average=load,
            hf_assisted_error=cost["hf_error"], acceptance=None, tokens_per_round=None, cost_ratio=None, block_ratio=None,
            leviathan_speedup=None, refined_speedup=None,
        )
        if v.k is not None:
            proposed = sum(x["proposed"] for x in reps)
            alpha = sum(x["accepted"] for x in reps) / proposed
            per_round = sum(x["emitted"] for x in reps) / sum(x["row_rounds"] for x in reps)
            r = cost["block"][v.k] / cost["target1"]
            row.update(
                acceptance=alpha, tokens_per_round=per_round, cost_ratio=c, block_ratio=r, block_forward_s=cost["block"][v.k],
                leviathan_speedup=leviathan_speedup(alpha, v.k, c), refined_speedup=refined_speedup(per_round, v.k, c, r),
                predicted_round_cost=v.k * c + r,
            )
        if mode == "greedy":
            pairs = [(a, b) for x, ref in zip(reps, reference) for a, b in zip(x["tokens"], ref["tokens"])]
            mismatched = sum(a != b for a, b in pairs)
            row.update(mismatched_rows=mismatched, rows_compared=len(pairs))
            row["equals_ar_text"] = "ref" if v.k is None else ("yes" if not mismatched else f"NO {mismatched}/{len(pairs)}")
        else:
            row.update(mismatched_rows=None, rows_compared=None, equals_ar_text="-")
        rows.append(row)
    lean = rows[0]["tokens_per_s_median"]
    for row in rows:
        row["vs_ar_lean"] = row["tokens_per_s_median"] / lean
        row["gap_leviathan"] = _gap(row["vs_ar_lean"], row["leviathan_speedup"])
        row["gap_refined"] = _gap(row["vs_ar_lean"], row["refined_speedup"])
    return rows


def summarise_batch(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    lines = []
    spec = [r for r in rows if r["variant"] == "spec"]
    for r in spec:
        lines.append(
            f"{r['mode']} B={r['batch']} k={r['k']}: measured {r['vs_ar_lean']:.2f}x ar-lean; Leviathan S {r['leviathan_speedup']:.2f}x "
            f"(gap {100 * r['gap_leviathan']:+.0f}%), refined S' {r['refined_speedup']:.2f}x (gap {100 * r['gap_refined']:+.0f}%); "
            f"alpha {r['acceptance']:.3f}, c {r['cost_ratio']:.3f}, r {r['block_ratio']:.3f}; a batch round took "
            f"{r['round_cost']:.2f} target forwards against k c + r = {r['predicted_round_cost']:.2f}"
        )
    for mode in dict.fromkeys(r["mode"] for r in rows):
        pays, not_pays = [], []
        for batch in dict.fromkeys(r["batch"] for r in rows if r["mode"] == mode):
            mine = [r for r in spec if r["mode"] == mode and r["batch"] == batch]
            lean = next(r for r in rows if r["mode"] == mode and r["batch"] == batch and r["variant"] == "ar-lean")
            if mine:
                best = max(mine, key=lambda r: r["tokens_per_s_median"])
                text = f"B={batch} (best k={best['k']} {best['vs_ar_lean']:.2f}x, ar-lean step = {lean['round_cost']:.2f} target forwards)"
                (pays if best["vs_ar_lean"] > 1.0 else not_pays).append(text)
        lines.append(
            f"{mode}: speculation pays (faster than ar-lean) at " + (", ".join(pays) or "no B")
            + ("; does not at " + ", ".join(not_pays) if not_pays else "")
        )
    greedy = [r for r in spec if r["mode"] == "greedy"]
    if greedy:
        bad = [r for r in greedy if r["mismatched_rows"]]
        compared = sum(r["rows_compared"] for r in greedy)
        lines.append(
            f"greedy: every spec row equals ar-lean token for token ({compared} rows)" if not bad
            else "greedy: MISMATCH with ar-lean: " + ", ".join(f"B={r['batch']} k={r['k']} {r['mismatched_rows']}/{r['rows_compared']} rows" for r in bad)
        )
    probed = {r["batch"]: r["hf_assisted_error"] for r in rows if r["batch"] > 1}
    head = f"transformers {transformers.__version__} assisted generation (target.generate(batch, assistant_model=draft))"
    if probed:
        errors = set(probed.values())
        if errors == {None}:
            lines.append(f"{head} runs at B={','.join(map(str, probed))}: not timed here")
        else:
            lines.append(
                f"{head} at B={','.join(str(b) for b, e in probed.items() if e)}: raises "
                + "; ".join(sorted(e for e in errors if e)) + " -> no hf-assisted rows at B > 1"
            )
    lines.append(f"{head} at B=1: see `specdec-bench decoder` (hf-assisted k=K rows, same pair)")
    return lines


def batch_header(args: argparse.Namespace) -> list[str]:
    return [
        f"batched decoding on the shipped pair (target Llama 2x128, draft Qwen2 1x64, V=256), B = {','.join(map(str, args.batch))} rows "
        f"(the first B of sample_prompts({max(args.batch)}, {args.prompt_length}, seed=0)), {args.new_tokens} new tokens per row, no EOS, "
        f"torch threads {args.threads}; per (mode, B) one warm-up call per variant, then {args.repeats} repeats, variants interleaved "
        "(rotating order)",
        "ar-lean = batched_autoregressive_decode(make_cache=fastest_cache); spec k=K = SpeculativeDecoder().decode_batch (same lean forward). "
        "tok/s = B x new tokens / wall s of the batch call (prefill included), median over repeats; x lean = ratio of medians; "
        "tok/tgt = B x new tokens / the batch's decode target calls (one call serves all rows; prefill excluded); alpha = accepted / "
        "proposed over all rounds of all rows; tok/rnd = mean tokens a row emits per round",
        "c = draft / target forward of [B,1]; r = target forward of [B,k+1] / of [B,1] (lean forward, medians, cache at the prompt); "
        "S = Leviathan et al. (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)); S' = tok/rnd / (k c + r); gap = x lean / S - 1; "
        "rnd/fwd = wall per batch round (AR: per step) in target [B,1] forwards, against kc+r (AR: 1): the rest is host work",
    ]


SUBCOMMAND = Subcommand(
    "batch",
    "batched speculative decoding vs batched AR on the lean forward at B = 1, 8, 64, with Leviathan's predicted speedup",
    add_batch_arguments,
    run_batch,
    BATCH_COLUMNS,
    summarise_batch,
    batch_header,
    exit_status=lambda rows: int(any(r.get("mismatched_rows") for r in rows)),
)
