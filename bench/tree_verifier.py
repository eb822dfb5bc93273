"""``specdec-bench tree-verifier``: throughput of the reference tree verifiers against the chain verifier.

Nodes judged per second (B x n per call) for :mod:`specdec_ref.tree`'s schemes on trees of ``n`` nodes and
depth ``D`` (level sizes grow then shrink, BFS order), next to :func:`specdec_ref.verify.verify_block` on
chains of the same number of tokens per row (``k = n``): the same tensors, so the ratio is the price of
the tree walk. Median and p10/p90 over repeats; rows of one run interleave nothing, so compare ratios
within one run.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from specdec_ref.tree import TREE_VERIFIERS
from specdec_ref.verify import verify_block

from .kit import Column, Subcommand, choice_list, columns, fmt_float, fmt_int, fmt_rate, int_list, percentile, time_calls

TREE_COLUMNS = [
    Column("kind", "kind"),
    Column("scheme", "scheme"),
    Column("mode", "mode"),
    *columns(fmt_int, threads="thr", batch="B", nodes="n", depth="depth", vocab="V", calls="calls/rep"),
    *columns(fmt_rate, nodes_per_s_median="nodes/s med", nodes_per_s_p10="p10", nodes_per_s_p90="p90"),
    Column("us_per_call_median", "us/call med", fmt_float(0)),
    Column("ratio_to_chain", "x chain", fmt_float(2)),
    Column("mean_accepted", "mean m", fmt_float(2)),
]


def tree_of(nodes: int, depth: int) -> np.ndarray:
    """A BFS-ordered tree with ``nodes`` nodes and exactly ``depth`` levels, EAGLE-like: nodes are added one at a
    time, round-robin over the levels, to any level smaller than twice the level above (the first level: 4);
    parents round-robin over the level above."""
    if not 1 <= depth <= nodes:
        raise ValueError(f"need 1 <= depth <= nodes, got depth={depth}, nodes={nodes}")
    sizes = [1] * depth
    while sum(sizes) < nodes:
        grown = False
        for level in range(depth):
            cap = 4 if level == 0 else 2 * sizes[level - 1]
            if sizes[level] < cap and sum(sizes) < nodes:
                sizes[level] += 1
                grown = True
        if not grown:
            sizes[-1] += nodes - sum(sizes)
    parents, above = [], [-1]
    for size in sizes:
        start = len(parents)
        parents.extend(above[i % len(above)] for i in range(size))
        above = list(range(start, start + size))
    return np.array(parents)


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int_list, default=[64], help="batch sizes B (default 64)")
    p.add_argument("--nodes", type=int_list, default=[64], help="nodes per tree n (default 64)")
    p.add_argument("--depth", type=int, default=6, help="tree depth (default 6)")
    p.add_argument("--vocab", type=int_list, default=[32000], help="vocabulary sizes V (default 32000)")
    p.add_argument("--scheme", type=choice_list(*TREE_VERIFIERS), default=list(TREE_VERIFIERS), help="tree schemes (default all)")
    p.add_argument("--mode", type=choice_list("sampling", "greedy"), default=["sampling", "greedy"], help="sampling,greedy (default both)")
    p.add_argument("--threads", type=int_list, default=[1], help="torch intra-op threads (default 1)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=0.3)
    p.add_argument("--warmup-seconds", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)


def _inputs(batch: int, parents: np.ndarray, vocab: int, seed: int):
    """Softmax rows (target = draft logits + noise); each node drawn from its parent's draft row."""
    gen = torch.Generator().manual_seed(seed)
    n = len(parents)
    slot_logits = 2.0 * torch.randn(batch, n + 1, vocab, generator=gen)
    q_slots = torch.softmax(slot_logits, -1)
    p = torch.softmax(slot_logits + 1.5 * torch.randn(batch, n + 1, vocab, generator=gen), -1)
    index = torch.as_tensor(parents + 1)
    q = q_slots[:, index]
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, n)
    return tokens, torch.as_tensor(parents).expand(batch, n).clone(), q, p


def _time(call, batch: int, nodes: int, args) -> dict:
    calls, seconds = time_calls(call, "cpu", repeats=args.repeats, min_seconds=args.min_seconds, warmup_seconds=args.warmup_seconds)
    rates = [batch * nodes * calls / s for s in seconds]
    return dict(
        calls=calls,
        nodes_per_s_median=percentile(rates, 50),
        nodes_per_s_p10=percentile(rates, 10),
        nodes_per_s_p90=percentile(rates, 90),
        us_per_call_median=percentile([s / calls * 1e6 for s in seconds], 50),
    )


def run_tree(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    original = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            for vocab in args.vocab:
                for nodes in args.nodes:
                    parents = tree_of(nodes, min(args.depth, nodes))
                    for batch in args.batch:
                        tokens, tree, q, p = _inputs(batch, parents, vocab, args.seed)
                        for mode in args.mode:
                            probs = q if mode == "sampling" else None
                            base = dict(threads=threads, batch=batch, nodes=nodes, vocab=vocab, mode=mode)
                            gen = torch.Generator().manual_seed(args.seed + 1)
                            m, _ = verify_block(tokens, probs, p, generator=gen, validate=False)
                            chain_row = dict(base, kind="chain", scheme="token", depth=nodes, mean_accepted=float(m.double().mean()))
                            chain_row.update(_time(lambda: verify_block(tokens, probs, p, generator=gen, validate=False), batch, nodes, args))
                            rows.append(chain_row)
                            _progress(chain_row)
                            for scheme in args.scheme:
                                verifier = TREE_VERIFIERS[scheme]()
                                out = verifier(tokens, tree, probs, p, generator=gen, validate=False)
                                row = dict(base, kind="tree", scheme=scheme, depth=int(min(args.depth, nodes)), mean_accepted=float(out.num_accepted.double().mean()))
                                row.update(_time(lambda: verifier(tokens, tree, probs, p, generator=gen, validate=False), batch, nodes, args))
                                row["ratio_to_chain"] = row["nodes_per_s_median"] / chain_row["nodes_per_s_median"]
                                rows.append(row)
                                _progress(row)
    finally:
        torch.set_num_threads(original)
    return rows


def _progress(row: dict) -> None:
    print(
        f"  [{row['kind']} {row['scheme']} {row['mode']} B={row['batch']} n={row['nodes']} V={row['vocab']}] "
        f"{fmt_rate(row['nodes_per_s_median'])} nodes/s",
        file=sys.stderr,
        flush=True,
    )


def summarise_tree(args: argparse.Namespace, rows: list[dict]) -> list[str]:
    trees = [r for r in rows if r["kind"] == "tree"]
    return [
        f"{r['scheme']} {r['mode']} B={r['batch']} n={r['nodes']} V={r['vocab']}: {fmt_rate(r['nodes_per_s_median'])} nodes/s, "
        f"{r['ratio_to_chain']:.2f}x the chain verifier on the same tokens"
        for r in trees
    ]


def level_sizes(parents: np.ndarray) -> list[int]:
    """Nodes per depth level of a topologically ordered tree."""
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return np.bincount(depth)[1:].tolist()


def tree_header(args: argparse.Namespace) -> list[str]:
    shapes = ", ".join(f"n={n}: levels {level_sizes(tree_of(n, min(args.depth, n)))}" for n in args.nodes)
    return [
        f"specdec_ref.tree verifiers vs verify_block on chains of k = n, cpu float32, no validation; trees ({shapes}); "
        f"{args.repeats} repeats of >= {args.min_seconds:g} s (median, p10, p90)"
    ]


SUBCOMMAND = Subcommand(
    "tree-verifier",
    "throughput of the reference tree verifiers (nodes/s) against the chain verifier on the same tokens",
    add_tree_arguments,
    run_tree,
    TREE_COLUMNS,
    summarise_tree,
    tree_header,
)
