"""``specdec-bench tree-decoder``: tree speculative decoding vs chain speculative decoding vs AR.

Tokens/s of :class:`specdec_ref.tree_decode.TreeSpeculativeDecoder` (a grid of depth x width shapes),
:class:`specdec_ref.decode.SpeculativeDecoder` (a k grid) and AR decoding (the transformers oracle and
the same on the lean static forward) on the shipped trained pair, greedy and sampling, the variants
interleaved over the repeats; tokens per target call, mean accepted length per round, tokens per
round, host syncs, and token-for-token equality with AR (greedy).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec_properties.tree_exact import depths, outcome_law
from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode
from specdec_ref.pretrained import CONTEXT_LENGTH, load_trained_pair, sample_prompts
from specdec_ref.static_cache import fastest_cache
from specdec_ref.tree import TREE_VERIFIERS
from specdec_ref.tree_decode import TreeSpeculativeDecoder
from specdec_ref.warp import GREEDY, SamplingConfig

from .kit import Column, Subcommand, choice_list, columns, fmt_float, int_list, load_average, percentile

TREE_VARIANTS = ("ar", "ar-lean", "chain", "tree")


def shape_list(text: str) -> list[tuple[int, int]]:
    """``"4x2,3x3"`` -> ``[(4, 2), (3, 3)]`` (depth x width; an argparse ``type``)."""
    shapes = []
    for item in (x for x in text.replace(" ", "").split(",") if x):
        try:
            depth, width = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected DEPTHxWIDTH items like 4x2, got {item!r}") from None
        if depth < 1 or width < 1:
            raise argparse.ArgumentTypeError(f"depth and width must be >= 1, got {item!r}")
        shapes.append((depth, width))
    if not shapes:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of DEPTHxWIDTH, got {text!r}")
    return shapes


TREE_COLUMNS = [
    *columns(mode="mode", label="variant"),
    *columns(fmt_float(0), tokens_per_s_median="tok/s med", tokens_per_s_p10="p10", tokens_per_s_p90="p90"),
    *columns(fmt_float(2), vs_ar="x AR", vs_ar_lean="x lean", vs_best_chain="x chain*"),
    Column("tokens_per_cpu_s_median", "tok/cpu-s", fmt_float(0)),
    Column("tokens_per_target_call", "tok/tgt call", fmt_float(2)),
    Column("accepted_per_round", "acc len", fmt_float(2)),
    Column("exact_accepted_per_round", "exact E", fmt_float(2)),
    Column("accepted_z", "z", fmt_float(1)),
    Column("tokens_per_round", "tok/rnd", fmt_float(2)),
    Column("nodes_per_round", "nodes/rnd", fmt_float(1)),
    *columns(fmt_float(1), draft_calls_per_100="drf/100"),
    Column("host_syncs_per_round", "sync/rnd", fmt_float(2)),
    Column("equals_ar_text", "= AR"),
]


def add_tree_decoder_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", type=choice_list("greedy", "sampling"), default=["greedy", "sampling"],
                   help="greedy,sampling (default both; sampling = temperature 1, no top-k/top-p)")
    p.add_argument("--k", type=int_list, default=[2, 4, 6], help="chain draft lengths (default 2,4,6)")
    p.add_argument("--shapes", type=shape_list, default=shape_list("2x2,4x2,3x3,6x2,4x4"),
                   help="tree shapes DEPTHxWIDTH (default 2x2,4x2,3x3,6x2,4x4)")
    p.add_argument("--tree-scheme", choices=sorted(TREE_VERIFIERS), default="specinfer",
                   help="tree verifier (and sibling drafting) for sampling (default specinfer; greedy drafts the top width)")
    p.add_argument("--new-tokens", type=int, default=128, help="new tokens per prompt (default 128; prompt + new tokens <= 256)")
    p.add_argument("--prompts", type=int, default=4, help="prompts from sample_prompts(n, length, seed=0) (default 4)")
    p.add_argument("--prompt-length", type=int, default=64, help="prompt length in bytes (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats, rotating the variant order (default 5)")
    p.add_argument("--variants", type=choice_list(*TREE_VARIANTS), default=list(TREE_VARIANTS),
                   help=f"{','.join(TREE_VARIANTS)} (default all)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the sampling generators (shared by the variants)")


class ExactExpectation:
    """A tree verifier that also records, for every tree it verifies, the accepted path length and its exact
    conditional mean and variance given the tree and its rows (``specdec_properties.tree_exact.outcome_law``, float64).

    Summed over rounds, ``observed - expected`` divided by the square root of the summed variances is a z-score:
    a decoder whose acceptance is lower than its trees allow (e.g. q not the rows the nodes were drawn from) shows
    up here even when its output stays exact. Greedy rows have zero variance (observed must equal expected).
    """

    def __init__(self, inner):
        self.inner = inner
        self.tree_scheme = inner.tree_scheme
        self.observed = self.expected = self.variance = 0.0
        self.rounds = 0

    def __call__(self, draft_tokens, parents, draft_probs, target_probs, *, generator=None, validate=True):
        out = self.inner(draft_tokens, parents, draft_probs, target_probs, generator=generator, validate=validate)
        scheme = "greedy" if draft_probs is None else self.tree_scheme
        for b in range(draft_tokens.shape[0]):
            real = int((draft_tokens[b] >= 0).sum())
            tree = parents[b, :real].cpu().numpy()
            q = None if draft_probs is None else draft_probs[b, :real].double().cpu().numpy()
            law = outcome_law(scheme, tree, draft_tokens[b, :real].cpu().numpy(), target_probs[b, : real + 1].double().cpu().numpy(), q)
            ends = law.sum(1)  # end 0 = root (m = 0), end i + 1 = node i (m = its depth)
            length = np.concatenate([[0.0], depths(tree).astype(float)])
            mean = float(ends @ length)
            self.expected += mean
            self.variance += float(ends @ length**2) - mean**2
            self.observed += float(out.num_accepted[b])
            self.rounds += 1
        return out

    @property
    def z(self) -> float | None:
        return (self.observed - self.expected) / self.variance**0.5 if self.variance > 0 else None


@dataclass(frozen=True)
class _Variant:
    name: str  # one of TREE_VARIANTS
    k: int | None = None
    depth: int | None = None
    width: int | None = None

    @property
    def label(self) -> str:
        if self.name == "chain":
            return f"chain k={self.k}"
        if self.name == "tree":
            return f"tree {self.depth}x{self.width}"
        return self.name


def _call(v: _Variant, target, draft, prompt, *, new_tokens: int, sampling, seed: int, tree_decoder) -> dict:
    generator = torch.Generator().manual_seed(seed)
    c0, t0 = time.process_time(), time.perf_counter()
    if v.name in ("ar", "ar-lean"):
        options = dict(make_cache=fastest_cache) if v.name == "ar-lean" else {}
        result = autoregressive_decode(target, prompt, max_new_tokens=new_tokens, sampling=sampling, generator=generator, **options)
    elif v.name == "chain":
        result = SpeculativeDecoder().decode(target, draft, prompt, k=v.k, max_new_tokens=new_tokens, sampling=sampling, generator=generator)
    else:
        result = tree_decoder.decode(
            target, draft, prompt, depth=v.depth, width=v.width, max_new_tokens=new_tokens, sampling=sampling, generator=generator
        )
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    spec_rounds = [r for r in result.rounds if r.proposed > 0]
    return dict(
        tokens=list(result.tokens), seconds=seconds, cpu_seconds=cpu_seconds, target_calls=result.target_calls,
        draft_calls=result.draft_calls, host_syncs=result.host_syncs,
        rounds=len(result.rounds) if v.name in ("chain", "tree") else len(result.tokens),
        spec_rounds=len(spec_rounds), accepted=sum(r.accepted for r in spec_rounds), nodes=sum(r.proposed for r in spec_rounds),
    )


def run_tree_decoder(args: argparse.Namespace) -> list[dict]:
    if args.prompt_length + args.new_tokens > CONTEXT_LENGTH:
        raise SystemExit(f"--prompt-length {args.prompt_length} + --new-tokens {args.new_tokens} exceeds the pair's context {CONTEXT_LENGTH}")
    if min(args.k, default=1) < 1 or args.new_tokens < 1 or args.prompts < 1 or args.repeats < 1:
        raise SystemExit("--k, --new-tokens, --prompts and --repeats must be >= 1")
    variants = []
    for name in TREE_VARIANTS:
        if name not in args.variants:
            continue
        if name == "chain":
            variants += [_Variant(name, k=k) for k in args.k]
        elif name == "tree":
            variants += [_Variant(name, depth=d, width=w) for d, w in args.shapes]
        else:
            variants.append(_Variant(name))
    tree_decoder = TreeSpeculativeDecoder(TREE_VERIFIERS[args.tree_scheme]())
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    target, draft = load_trained_pair()
    prompts = sample_prompts(args.prompts, length=args.prompt_length, seed=0)
    rows: list[dict] = []
    try:
        for mode in args.mode:
            sampling = GREEDY if mode == "greedy" else SamplingConfig(temperature=1.0)

            def call(v, i, r):
                seed = args.seed * 1_000_003 + (r + 1) * 1_009 + i
                return _call(v, target, draft, prompts[i], new_tokens=args.new_tokens, sampling=sampling, seed=seed, tree_decoder=tree_decoder)

            for v in variants:  # warm-up
                call(v, 0, -1)
            runs: dict[str, list[list[dict]]] = {v.label: [] for v in variants}
            for r in range(args.repeats):
                for v in variants:
                    runs[v.label].append([])
                for i in range(len(prompts)):
                    shift = (r * len(prompts) + i) % len(variants)
                    for v in variants[shift:] + variants[:shift]:
                        runs[v.label][r].append(call(v, i, r))
                print(f"  [{mode}] repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
            mode_rows = _rows(mode, variants, runs, args)
            for row in mode_rows:
                row["load_average"] = load_average()
                if row["variant"] == "tree":  # untimed pass: the exact expected accepted length of the same decodes
                    probe = ExactExpectation(tree_decoder.tree_verifier)
                    probed = TreeSpeculativeDecoder(probe)
                    for i in range(len(prompts)):
                        seed = args.seed * 1_000_003 + 1_009 + i  # repeat 0's seeds
                        v = _Variant("tree", depth=row["depth"], width=row["width"])
                        _call(v, target, draft, prompts[i], new_tokens=args.new_tokens, sampling=sampling, seed=seed, tree_decoder=probed)
                    row.update(
                        exact_accepted_per_round=probe.expected / probe.rounds if probe.rounds else None,
                        probed_accepted_per_round=probe.observed / probe.rounds if probe.rounds else None,
                        accepted_z=probe.z,
                    )
            rows.extend(mode_rows)
    finally:
        torch.set_num_threads(previous_threads)
    return rows


def _rows(mode: str, variants: list[_Variant], runs: dict[str, list[list[dict]]], args) -> list[dict]:
    reference = runs.get("ar") or runs.get("ar-lean")
    rows = []
    for v in variants:
        reps = runs[v.label]
        flat = [x for rep in reps for x in rep]
        tokens = sum(len(x["tokens"]) for x in flat)
        rates = [sum(len(x["tokens"]) for x in rep) / sum(x["seconds"] for x in rep) for rep in reps]
        cpu_rates = [sum(len(x["tokens"]) for x in rep) / sum(x["cpu_seconds"] for x in rep) for rep in reps]
        rounds = sum(x["rounds"] for x in flat)
        spec_rounds = sum(x["spec_rounds"] for x in flat)
        row: dict[str, Any] = dict(
            mode=mode, variant=v.name, label=v.label, k=v.k, depth=v.depth, width=v.width, tree_scheme=args.tree_scheme,
            prompts=args.prompts, prompt_length=args.prompt_length, new_tokens=args.new_tokens, repeats=len(reps), threads=args.threads,
            tokens_per_s=rates, tokens_per_s_median=percentile(rates, 50), tokens_per_s_p10=percentile(rates, 10),
            tokens_per_s_p90=percentile(rates, 90), tokens_per_cpu_s_median=percentile(cpu_rates, 50),
            tokens_per_target_call=tokens / sum(x["target_calls"] for x in flat),
            draft_calls_per_100=100 * sum(x["draft_calls"] for x in flat) / tokens,
            tokens_per_round=tokens / rounds if rounds else None,
            accepted_per_round=sum(x["accepted"] for x in flat) / spec_rounds if spec_rounds else None,
            nodes_per_round=sum(x["nodes"] for x in flat) / spec_rounds if spec_rounds else None,
            host_syncs_per_round=sum(x["host_syncs"] for x in flat) / rounds if rounds else None,
        )
        if reference is not None and mode == "greedy":
            pairs = [(x["tokens"], y["tokens"]) for rep, ref in zip(reps, reference) for x, y in zip(rep, ref)]
            equal = sum(a == b for a, b in pairs)
            row.update(equal_runs=equal, runs=len(pairs), equals_ar=equal == len(pairs))
            row["equals_ar_text"] = "ref" if reps is reference else ("yes" if equal == len(pairs) else f"NO {equal}/{len(pairs)}")
        else:
            row.update(equals_ar=None, equals_ar_text="-")
        rows.append(row)
    by_label = {r["label"]: r for r in rows}
    chains = [r for r in rows if r["variant"] == "chain"]
    best_chain = max(chains, key=lambda r: r["tokens_per_s_median"]) if chains else None
    for row in rows:
        for key, ref in (("ar", by_label.get("ar")), ("ar_lean", by_label.get("ar-lean")), ("best_chain", best_chain)):
            row[f"vs_{key}"] = row["tokens_per_s_median"] / ref["tokens_per_s_median"] if ref else None
    return rows


def summarise_tree_decoder(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        trees = [r for r in mine if r["variant"] == "tree"]
        chains = [r for r in mine if r["variant"] == "chain"]
        get = {r["label"]: r for r in mine}
        parts = []
        for group in (trees, chains):
            if group:
                best = max(group, key=lambda r: r["tokens_per_s_median"])
                parts.append(
                    f"best {best['label']}: {best['tokens_per_s_median']:.0f} tok/s, {best['tokens_per_target_call']:.2f} tok/target call, "
                    f"accepted length {best['accepted_per_round']:.2f}"
                )
        for name in ("ar-lean", "ar"):
            if name in get:
                parts.append(f"{name}: {get[name]['tokens_per_s_median']:.0f} tok/s")
        if trees and chains:
            bt = max(trees, key=lambda r: r["tokens_per_s_median"])
            bc = max(chains, key=lambda r: r["tokens_per_s_median"])
            parts.append(f"best tree / best chain = {bt['tokens_per_s_median'] / bc['tokens_per_s_median']:.2f}x tok/s, "
                         f"{bt['tokens_per_target_call'] / bc['tokens_per_target_call']:.2f}x tok/target call")
        lines.append(f"{mode}: " + "; ".join(parts))
        for r in trees:
            if r.get("exact_accepted_per_round") is not None:
                z = "" if r.get("accepted_z") is None else f", z = {r['accepted_z']:.2f}"
                lines.append(
                    f"{mode}: {r['label']} accepted {r['probed_accepted_per_round']:.3f} per round against the exact expectation "
                    f"{r['exact_accepted_per_round']:.3f} given its trees (same decodes{z})"
                )
        if mode == "greedy":
            unequal = [r["label"] for r in mine if r.get("equals_ar") is False]
            lines.append(f"{mode}: every output equals AR token for token" if not unequal else f"{mode}: NOT EQUAL to AR: {', '.join(unequal)}")
    return lines


def tree_decoder_header(args: argparse.Namespace) -> list[str]:
    return [
        f"tree vs chain vs AR on the shipped pair (target Llama 2x128, draft Qwen2 1x64, V=256), {args.prompts} prompt(s) of "
        f"{args.prompt_length} bytes, {args.new_tokens} new tokens each, torch threads {args.threads}, tree scheme {args.tree_scheme} "
        f"(sampling); one warm-up call per variant, then {args.repeats} repeats, variants interleaved per prompt (rotating order)",
        "tok/s = new tokens / wall s per repeat, median (p10, p90); x AR / x lean / x chain* = ratio of medians to ar, ar-lean and the "
        "fastest chain; tok/tgt call = new tokens / target forward calls (prefill included); acc len = accepted drafts (tree: path "
        "length m) per speculative round; exact E = the exact expected path length given each verified tree (float64 oracle, "
        "one untimed pass over the first repeat's decodes) and z its deviation in standard errors; nodes/rnd = drafted nodes "
        "per round; drf/100 = draft calls per 100 new tokens",
    ]


SUBCOMMAND = Subcommand(
    "tree-decoder",
    "tokens/s, tokens per target call and accepted length of tree vs chain speculative decoding vs AR on the shipped trained pair",
    add_tree_decoder_arguments,
    run_tree_decoder,
    TREE_COLUMNS,
    summarise_tree_decoder,
    tree_decoder_header,
)
