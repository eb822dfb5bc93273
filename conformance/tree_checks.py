"""Conformance checks of tree verification (``backend.verify_tree``; the contract is in :mod:`specdec_ref.contract`).

Statistical checks draft trees from Markov tables exactly as the backend's declared ``tree_scheme``
requires (:func:`specdec_properties.tree_sampling.draw_markov_trees`) and compare what ``verify_tree`` emits
with the scheme's exact float64 laws (:mod:`specdec_properties.tree_exact`, written independently of the
reference): the law of (last accepted node, final token) *given* a drafted tree, the law of
(accepted length, final token) of one round marginalised over the drafting, and the target's own
law over many rounds. Deterministic checks run on Hypothesis trees (chains, stars, k-ary, random;
depth 1..8, up to 64 nodes; rows of different trees, padded, in one batch).

Trees are drafted on the CPU and handed to ``verify_tree`` on ``ctx.device`` (``--specdec-device``) with
generators made there (``device=`` of :func:`specdec_properties.tree_sampling.verify_tree_rows`,
:func:`specdec_properties.sampling.device_generator`); outputs come back to the CPU before any statistic.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from hypothesis import given, note

from specdec_properties import tree_exact
from specdec_properties.markov import empty_simulation, markov_pair, sequence_labels, sequence_law
from specdec_properties.sample_size import (
    NON_BATCHED_SEQUENCES,
    NON_BATCHED_TREES,
    TREE_PATH_TV,
    TREE_ROUND_TV,
    TREE_SEQUENCE_TV,
    required_samples,
    scaled_blocks,
    with_margin,
)
from specdec_properties.sampling import CHUNK, device_generator, is_batched
from specdec_properties.stats import assert_fits, estimate_tv
from specdec_properties.strategies import TreeBlock, greedy_maximisers, seeds, tree_blocks
from specdec_properties.tree_sampling import (
    DISTINCT_SIBLINGS,
    depth_cells,
    draw_markov_trees,
    end_cells,
    tree_sampler,
    tree_scheme_of,
    verify_tree_rows,
)

from . import streams
from .registry import CheckContext, NotApplicable, check

#: Sequences per chunk of ``tree_sampling_sequence_law_over_rounds`` for a backend called one row at a time (a
#: divisor of its cap, ``NON_BATCHED_SEQUENCES``).
NON_BATCHED_SEQUENCE_CHUNK = 1000

#: The Markov tables every statistical tree check drafts from (V = 8, token-wise acceptance 0.7).
TREE_PAIR = markov_pair()
#: Fixed tree shapes of the per-tree checks (``parents`` arrays). ``dfs`` is in depth-first order,
#: so a verifier assuming breadth-first order (or a dense accepted prefix) misreads it.
TREE_SHAPES: dict[str, np.ndarray] = {
    "chain": tree_exact.chain(4),
    "star": tree_exact.star(4),
    "binary": tree_exact.kary(2, 2),
    "eagle": tree_exact.eagle_like(2, 3),
    "dfs": np.array([-1, 0, 1, 1, 0, -1, 5, 6]),
}
#: Start tokens of the trees drafted for the conditional (given-the-tree) checks: one tree per start.
TREE_STARTS = (0, 3, 5)
#: The tree of the multi-round check: siblings at every level, depth 3.
SEQUENCE_SHAPE = np.array([-1, -1, 0, 0, 2, 2])
SEQUENCE_LENGTH = 3


def declared_tree_scheme(backend) -> str:
    """The backend's exact tree scheme; NotApplicable for ``lossy`` (no exact law to test)."""
    scheme = tree_scheme_of(backend)
    if scheme == "lossy":
        raise NotApplicable(
            "the backend declares a lossy tree scheme: there is no exact law to test; "
            "tree_sampling_sequence_law_over_rounds measures its distance from the target's law instead"
        )
    return scheme


def _shape_cases():
    return [(name, {"shape": name}) for name in TREE_SHAPES]


def _group(params: dict) -> str:
    return f"tree-{params['shape']}"


#: Candidate trees drafted per start token; the one whose walk ends at the most varied nodes is kept.
TREE_CANDIDATES = 32


def _end_entropy(law: np.ndarray, vocab: int) -> float:
    ends = law.reshape(-1, vocab).sum(1)
    ends = ends[ends > 0]
    return float(-(ends * np.log(ends)).sum())


@functools.lru_cache(maxsize=None)
def drafted_trees(scheme: str, shape: str, seed: int):
    """One tree of ``shape`` per start token of :data:`TREE_STARTS`, drafted as ``scheme`` requires, with the
    exact law of (end node, final token) given each tree.

    Of :data:`TREE_CANDIDATES` drafted trees per start the one whose walk ends at the most varied nodes (largest
    entropy of the end node) is kept, so that rejections, later siblings and residuals are all exercised: a tree
    whose first sibling is always accepted could not show a bug in how later siblings are judged.
    """
    parents = TREE_SHAPES[shape]
    starts = torch.tensor(TREE_STARTS).repeat_interleave(TREE_CANDIDATES)
    tokens, tree, qs, p = draw_markov_trees(scheme, parents, TREE_PAIR, starts, torch.Generator().manual_seed(seed))
    laws = [
        tree_exact.outcome_law(scheme, parents, tokens[i].numpy(), p[i].double().numpy(), qs[i].double().numpy()).reshape(-1)
        for i in range(len(starts))
    ]
    keep = [
        max(range(j * TREE_CANDIDATES, (j + 1) * TREE_CANDIDATES), key=lambda i: _end_entropy(laws[i], TREE_PAIR.vocab))
        for j in range(len(TREE_STARTS))
    ]
    return tokens[keep], tree[keep], qs[keep], p[keep], [laws[i] for i in keep]


def _end_labels(n: int, vocab: int) -> list[str]:
    return [f"{'root' if end == 0 else f'node {end - 1}'} -> {x}" for end in range(n + 1) for x in range(vocab)]


def _describe_tree(shape: str, tokens: torch.Tensor, start: int) -> str:
    return f"tree {shape!r} parents {TREE_SHAPES[shape].tolist()} tokens {tokens.tolist()} after start token {start}"


def _path_law_fit(backend, ctx: CheckContext, shape: str, *, filler: bool, tv: float):
    """Replicate each drafted tree of ``shape`` over many rows (optionally interleaved with other trees) and fit its law."""
    scheme = declared_tree_scheme(backend)
    seed = ctx.seed_for("tree-draft", shape)
    tokens, tree, qs, p, laws = drafted_trees(scheme, shape, seed)
    n, vocab = tree.shape[1], TREE_PAIR.vocab
    gen = device_generator(ctx.seed_for("tree-verify", shape, filler), ctx.device)
    for i, law in enumerate(laws):
        rows = scaled_blocks(with_margin(required_samples(law, tv)), batched=is_batched(backend), scale=ctx.sample_scale, cap=NON_BATCHED_TREES)
        where = _describe_tree(shape, tokens[i], TREE_STARTS[i])
        batch = (tokens[i : i + 1].expand(rows, -1), tree[i : i + 1].expand(rows, -1), qs[i : i + 1].expand(rows, -1, -1), p[i : i + 1].expand(rows, -1, -1))
        if filler:
            batch = _interleave_filler(batch, scheme, ctx.seed_for("tree-filler", shape, i))
        m, path, out = verify_tree_rows(backend, *batch, generator=gen, where=where, vocab=vocab, device=ctx.device)
        if filler:
            m, path, out = m[1::2], path[1::2, :n], out[1::2, : n + 1]
        counts = np.bincount(end_cells(m, path, out, vocab).numpy(), minlength=(n + 1) * vocab)
        ctx.record(
            assert_fits(
                counts,
                law,
                what=f"(last accepted node, final token) given the {where} [tree scheme {scheme}{'; rows interleaved with other trees' if filler else ''}]",
                labels=_end_labels(n, vocab),
                tv=tv,
                seed=seed,
                replay=ctx.replay,
            )
        )


def pad_trees(tokens, tree, qs, p, width: int):
    """Trees padded to ``width`` nodes: padded nodes carry token -1 (and parent -1), their rows copy the last row
    (valid, never read)."""
    extra = width - tokens.shape[1]
    if extra <= 0:
        return tokens, tree, qs, p

    def ids(t):
        return torch.cat([t, torch.full((t.shape[0], extra), -1, dtype=t.dtype)], 1)

    def rows(t):
        return torch.cat([t, t[:, -1:].expand(-1, extra, -1)], 1)

    return ids(tokens), ids(tree), rows(qs), rows(p)


def _interleave_filler(batch, scheme: str, seed: int):
    """Even rows: other trees (a star and a deeper random tree, padded to a common width); odd rows: ``batch``."""
    rows = batch[0].shape[0]
    other = np.array([-1, -1, 1, 2, 2, 4, -1, 6, 7, 8, 9])
    starts = torch.randint(0, TREE_PAIR.vocab, (rows,), generator=torch.Generator().manual_seed(seed))
    filler = draw_markov_trees(scheme, other, TREE_PAIR, starts, torch.Generator().manual_seed(seed + 1))
    width = max(batch[0].shape[1], len(other))

    def mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.empty((2 * rows, *a.shape[1:]), dtype=a.dtype)
        out[0::2], out[1::2] = a, b
        return out

    return tuple(mix(a, b) for a, b in zip(pad_trees(*filler, width), pad_trees(*batch, width)))


# ----------------------------------------------------------------------------- statistical


@check(
    guards="a rejected sibling's mass kept in the residual (so a rejected token is re-emitted), the residual or the next "
    "node's row taken from the wrong node (parent, grandparent, flat index), one coin reused across siblings, siblings "
    "tried in another order, replacement from the target alone, another tree scheme than declared",
    requires=("tree", "sampling"),
    cases=_shape_cases(),
    group=_group,
    statistical=True,
)
def check_tree_sampling_path_law(backend, ctx: CheckContext, shape: str):
    """Given a drafted tree, (last accepted node, final token) has the declared scheme's exact law.

    Three trees per shape (one per start token), each replicated over many rows; each law is exact
    (specdec_properties.tree_exact.outcome_law) and tested at power 0.99 against TV 0.02.
    """
    _path_law_fit(backend, ctx, shape, filler=False, tv=TREE_PATH_TV)


@functools.lru_cache(maxsize=None)
def round_law(scheme: str, shape: str) -> np.ndarray:
    """Exact law of (accepted length m, final token) of one round from ``TREE_PAIR.start``, over the drafting."""
    parents = TREE_SHAPES[shape]
    depth = int(tree_exact.depths(parents).max())
    law = np.zeros((depth + 1) * TREE_PAIR.vocab)
    for emitted, prob in tree_exact.tree_round_law(scheme, parents, TREE_PAIR, TREE_PAIR.start).items():
        law[(len(emitted) - 1) * TREE_PAIR.vocab + emitted[-1]] += prob
    return law


@check(
    guards="acceptance lost or gained without visible bias: siblings drafted or judged as another scheme, a child never "
    "tried after a rejected sibling, residual of the wrong sibling's draft row, early stop at the first rejection",
    requires=("tree", "sampling"),
    cases=_shape_cases(),
    group=_group,
    statistical=True,
)
def check_tree_sampling_round_law(backend, ctx: CheckContext, shape: str):
    """Over freshly drafted trees, (accepted length, final token) of one round has the scheme's exact law:
    the accepted length's law is the scheme's own efficiency (its exact mean is stated)."""
    scheme = declared_tree_scheme(backend)
    parents = TREE_SHAPES[shape]
    law = round_law(scheme, shape)
    vocab = TREE_PAIR.vocab
    depth = len(law) // vocab - 1
    rows = scaled_blocks(with_margin(required_samples(law, TREE_ROUND_TV)), batched=is_batched(backend), scale=ctx.sample_scale, cap=NON_BATCHED_TREES)
    seed = ctx.seed_for("tree-round", shape)
    starts = torch.full((rows,), TREE_PAIR.start)
    tokens, tree, qs, p = draw_markov_trees(scheme, parents, TREE_PAIR, starts, torch.Generator().manual_seed(2 * seed))
    where = f"tree {shape!r} (parents {parents.tolist()}) freshly drafted per row from start token {TREE_PAIR.start}"
    m, _, out = verify_tree_rows(
        backend, tokens, tree, qs, p, generator=device_generator(2 * seed + 1, ctx.device), where=where, vocab=vocab, device=ctx.device
    )
    counts = np.bincount(depth_cells(m, out, vocab).numpy(), minlength=len(law))
    exact_mean = float(law.reshape(depth + 1, vocab).sum(1) @ np.arange(depth + 1))
    ctx.record(
        assert_fits(
            counts,
            law,
            what=f"(accepted length, final token) of one round, {where} [tree scheme {scheme}; exact mean accepted "
            f"{exact_mean:.4f}, observed {float(m.float().mean()):.4f}]",
            labels=[f"m={j} -> {x}" for j in range(depth + 1) for x in range(vocab)],
            tv=TREE_ROUND_TV,
            seed=seed,
            replay=ctx.replay,
        )
    )


@check(
    guards="any loss of exactness over rounds, whatever the tree scheme: a biased acceptance or residual, rows from the "
    "wrong node, siblings drafted one way and judged another (e.g. without replacement but judged as with), a lossy "
    "kernel (acceptance thresholds below 1) declared exact",
    requires=("tree", "sampling"),
    statistical=True,
)
def check_tree_sampling_sequence_law_over_rounds(backend, ctx: CheckContext):
    """Text decoded round after round through verify_tree() follows the target's autoregressive law.

    Every round drafts a tree of shape SEQUENCE_SHAPE (siblings at each level, depth 3) from the
    Markov draft table as the declared scheme requires; the first 3 tokens (512 cells) are tested
    against the target's exact law at power 0.99 against TV 0.01. For a backend declaring ``lossy``
    the same sample measures the total variation with a 99% confidence interval, and the tokens per
    round against the exact ``deterministic`` scheme on the same trees.
    """
    pair, length = TREE_PAIR, SEQUENCE_LENGTH
    law = sequence_law(pair, length)
    n = scaled_blocks(with_margin(required_samples(law, TREE_SEQUENCE_TV)), batched=is_batched(backend), scale=ctx.sample_scale, cap=NON_BATCHED_SEQUENCES)
    seed = ctx.seed_for("tree-sequence-law")
    parts, _ = streams.chunks(  # every look of the case takes whole chunks of one simulation (conformance.streams)
        ctx.streams, ("tree-sequence-law", seed), n, chunk=CHUNK if is_batched(backend) else NON_BATCHED_SEQUENCE_CHUNK,
        start=lambda: tree_sampler(backend, pair, SEQUENCE_SHAPE, length=length, seed=seed, device=ctx.device),
        draw=lambda draw, i, size: draw(size),
    )
    run = sum(parts, empty_simulation(pair, length))
    what = f"first {length} tokens decoded over rounds of trees {SEQUENCE_SHAPE.tolist()} vs the target's law [{pair.describe()}]"
    if tree_scheme_of(backend) == "lossy":
        exact_per_round = tree_exact.tree_tokens_per_round("deterministic", SEQUENCE_SHAPE, pair)
        baseline = float(run.rounds @ exact_per_round) / max(int(run.rounds.sum()), 1)
        extra = {
            "tokens_per_round": run.tokens_per_round,
            "exact_scheme": "deterministic tree",
            "exact_tokens_per_round": baseline,
            "gain": run.tokens_per_round / baseline,
        }
        ctx.record(estimate_tv(run.counts, law, what=what, extra=extra))
        return
    ctx.record(assert_fits(run.counts, law, what=what, labels=sequence_labels(pair.vocab, length), tv=TREE_SEQUENCE_TV, seed=seed, replay=ctx.replay))


@check(
    guards="a row's result depending on other rows of the batch: padding of shorter trees read as nodes, parents or rows "
    "indexed across rows, batch-wide normalisation",
    requires=("tree", "sampling", "batched"),
    cases=[("eagle", {"shape": "eagle"})],
    statistical=True,
)
def check_tree_sampling_batch_invariance(backend, ctx: CheckContext, shape: str):
    """Rows of a drafted tree interleaved with rows of other, differently shaped and padded trees keep its exact law."""
    _path_law_fit(backend, ctx, shape, filler=True, tv=TREE_PATH_TV)


# ----------------------------------------------------------------------------- deterministic


def _call(backend, block: TreeBlock, generator=None, *, device=None):
    """``verify_tree`` on the block with its tensors on ``device`` (the generator must live there); outputs on the CPU."""
    __tracebackhide__ = True
    return verify_tree_rows(
        backend, block.draft_tokens, block.parents, block.draft_probs, block.target_probs,
        generator=generator, where=block.describe(), vocab=block.vocab, device=device,
    )


def _distinct(backend) -> bool:
    return tree_scheme_of(backend) in DISTINCT_SIBLINGS


@check(
    guards="accepted paths that are not root-to-node (a child accepted after its parent was rejected, siblings both "
    "accepted), padding read as nodes, tokens not those of the path, missing final token, wrong shapes or dtypes",
    requires=("tree", "sampling"),
)
def check_tree_structure_sampling(backend, ctx: CheckContext):
    """Sampling output on Hypothesis trees: the path goes from the root down, its tokens are the nodes', one final token, -1 after."""

    @given(block=tree_blocks(greedy=False, distinct_siblings=_distinct(backend)), seed=seeds)
    def structure(block, seed):
        note(block.describe())
        _call(backend, block, device_generator(seed, ctx.device), device=ctx.device)

    structure()


@check(
    guards="accepted paths that are not root-to-node, padding read as nodes, wrong shapes or dtypes (greedy mode)",
    requires=("tree", "greedy"),
)
def check_tree_structure_greedy(backend, ctx: CheckContext):
    """Greedy output on Hypothesis trees has the contract's structure."""

    @given(block=tree_blocks(greedy=True))
    def structure(block):
        note(block.describe())
        _call(backend, block, device=ctx.device)

    structure()


@check(
    guards="greedy tree verification judging a node with the wrong row (its own, its grandparent's, the flat index's), "
    "stopping at the first non-matching sibling, a final token that is not the greedy choice",
    requires=("tree", "greedy"),
)
def check_tree_greedy_longest_path(backend, ctx: CheckContext):
    """Greedy output is the longest greedy path: every accepted node's token is a maximiser of its parent's row, the
    final token a maximiser of the last node's row, and no child of the last node carries the final token (it would
    have been accepted). Without ties this is exactly the target's greedy continuation."""

    @given(block=tree_blocks(greedy=True))
    def longest(block):
        note(block.describe())
        m, path, tokens = _call(backend, block, device=ctx.device)
        rows = block.target_probs.numpy()
        drafts, parents = block.draft_tokens.numpy(), block.parents.numpy()
        for b in range(drafts.shape[0]):
            mb, previous = int(m[b]), -1
            for j in range(mb):
                node = int(path[b, j])
                best = greedy_maximisers(rows[b, previous + 1])
                assert drafts[b, node] in best, (
                    f"row {b}: node {node} (token {drafts[b, node]}) was accepted under "
                    f"{'the root' if previous < 0 else f'node {previous}'} but the maximisers of that row are {best.tolist()}"
                )
                previous = node
            final = int(tokens[b, mb])
            best = greedy_maximisers(rows[b, previous + 1])
            assert final in best, f"row {b}: the final token {final} is not a maximiser {best.tolist()} of the last accepted node's row"
            children = [c for c in range(drafts.shape[1]) if drafts[b, c] >= 0 and parents[b, c] == previous]
            matching = [c for c in children if drafts[b, c] == final]
            assert not matching, (
                f"row {b}: stopped at {'the root' if previous < 0 else f'node {previous}'} and emitted {final}, but its "
                f"child node {matching[0]} carries {final}: a child matching the greedy choice must be accepted "
                f"(path {path[b, :mb].tolist()}, parents {parents[b].tolist()}, tokens {drafts[b].tolist()})"
            )

    longest()


@check(
    guards="acceptance or the final token ignoring the target (replacement from q, the wrong node's row, a rejected "
    "sibling's token re-emitted), a hot child not accepted because an earlier sibling was rejected",
    requires=("tree", "sampling"),
)
def check_tree_sampling_one_hot_target_is_deterministic(backend, ctx: CheckContext):
    """With one-hot target rows the output is determined: the walk follows the child carrying the hot token (if any)
    and emits the hot token of the node where it stops."""

    @given(block=tree_blocks(greedy=False, distinct_siblings=_distinct(backend)), seed=seeds)
    def deterministic(block, seed):
        hot = block.target_probs.argmax(-1)
        one_hot = torch.nn.functional.one_hot(hot, block.vocab).float()
        block = TreeBlock(block.draft_tokens, block.parents, block.draft_probs, one_hot, block.kinds)
        note(block.describe())
        m, path, tokens = _call(backend, block, device_generator(seed, ctx.device), device=ctx.device)
        drafts, parents = block.draft_tokens, block.parents
        for b in range(drafts.shape[0]):
            expected, current = [], -1
            while True:
                child = next((c for c in range(drafts.shape[1]) if drafts[b, c] >= 0 and parents[b, c] == current and drafts[b, c] == hot[b, current + 1]), None)
                if child is None:
                    break
                expected.append(child)
                current = child
            got = path[b, : int(m[b])].tolist()
            assert got == expected, (
                f"row {b}: one-hot target rows (hot tokens {hot[b].tolist()} for root, node 0, ...): expected the path "
                f"{expected}, got {got} (parents {parents[b].tolist()}, tokens {drafts[b].tolist()})"
            )
            assert int(tokens[b, m[b]]) == int(hot[b, current + 1]), (
                f"row {b}: after the path {expected} the final token must be the hot token {int(hot[b, current + 1])}, got {int(tokens[b, m[b]])}"
            )

    deterministic()


def _seeded_tree_run(backend, seed: int, device, rows: int = 4096):
    scheme = tree_scheme_of(backend)
    parents = TREE_SHAPES["eagle"]
    starts = torch.full((rows,), TREE_PAIR.start)
    tokens, tree, qs, p = draw_markov_trees("deterministic" if scheme == "lossy" else scheme, parents, TREE_PAIR, starts, torch.Generator().manual_seed(12345))
    where = f"{rows} eagle trees, generator seed {seed}"
    return verify_tree_rows(
        backend, tokens, tree, qs, p, generator=device_generator(seed, device), where=where, vocab=TREE_PAIR.vocab, device=device
    )


@check(guards="seeds ignored by tree verification: results that differ for the same generator seed, or do not change with it", requires=("tree", "sampling"))
def check_tree_sampling_seeded_reproducible(backend, ctx: CheckContext):
    """The same generator seed gives bit-identical tree results; another seed gives different ones."""
    seed = ctx.seed_for("tree-seeded")
    _, _, t1 = _seeded_tree_run(backend, seed, ctx.device)
    _, _, t2 = _seeded_tree_run(backend, seed, ctx.device)
    diff = (t1 != t2).any(1).nonzero()
    row = int(diff[0]) if len(diff) else 0
    assert len(diff) == 0, f"generator seed {seed} gave different results in row {row}: {t1[row].tolist()} vs {t2[row].tolist()}"
    _, _, t3 = _seeded_tree_run(backend, seed + 1, ctx.device)
    assert not torch.equal(t1, t3), f"generator seeds {seed} and {seed + 1} gave identical results on 4096 trees: is the generator used?"


@check(guards="tree verification drawing randomness from the global RNG instead of the given generator", requires=("tree", "sampling"))
def check_tree_sampling_ignores_global_rng(backend, ctx: CheckContext):
    """With a generator given, the global torch RNG state does not change the tree result."""
    seed = ctx.seed_for("tree-global")
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(1)
        _, _, t1 = _seeded_tree_run(backend, seed, ctx.device)
        torch.manual_seed(2)
        _, _, t2 = _seeded_tree_run(backend, seed, ctx.device)
    finally:
        torch.random.set_rng_state(state)
    diff = (t1 != t2).any(1).nonzero()
    row = int(diff[0]) if len(diff) else 0
    assert len(diff) == 0, f"same generator seed {seed}, different global seeds (1 vs 2): row {row} gave {t1[row].tolist()} vs {t2[row].tolist()}"


@check(
    guards="per-request seeds ignored by tree verification (one stream for the batch), a seeded row's output depending "
    "on its neighbours or position, unseeded rows all given one default seed",
    requires=("tree", "sampling", "batched", "row_generators"),
)
def check_tree_sampling_row_generators_reproduce_alone(backend, ctx: CheckContext):
    """With one generator per row (even rows seeded, odd rows unseeded) in a ragged batch (even rows: 6-node trees
    padded to 10 nodes; odd rows: 10-node EAGLE-like trees), every seeded row's output is bit-identical verified
    alone, unpadded, with its own generator, and in the reversed batch under another global RNG state."""
    scheme = "deterministic" if tree_scheme_of(backend) == "lossy" else tree_scheme_of(backend)
    rows, base = 128, ctx.seed_for("tree-row-generators")
    starts = torch.arange(rows // 2) % TREE_PAIR.vocab
    short = draw_markov_trees(scheme, TREE_SHAPES["binary"], TREE_PAIR, starts, torch.Generator().manual_seed(base))
    long = draw_markov_trees(scheme, TREE_SHAPES["eagle"], TREE_PAIR, starts, torch.Generator().manual_seed(base + 1))
    width, n_short = len(TREE_SHAPES["eagle"]), len(TREE_SHAPES["binary"])
    padded = pad_trees(*short, width)
    tokens, tree, qs, p = (torch.stack([a, b], 1).reshape(rows, *a.shape[1:]) for a, b in zip(padded, long))
    seeds = [base + b if b % 2 == 0 else None for b in range(rows)]

    def run(index: torch.Tensor, global_seed: int, where: str, nodes: int = width):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(global_seed)
            gens = [None if seeds[int(b)] is None else device_generator(seeds[int(b)], ctx.device) for b in index]
            args = (tokens[index, :nodes], tree[index, :nodes], qs[index, :nodes], p[index, : nodes + 1])
            return verify_tree_rows(backend, *args, generator=gens, where=where, vocab=TREE_PAIR.vocab, device=ctx.device)[2]

    everything = torch.arange(rows)
    batch = run(everything, 1, "ragged mixed batch of trees, global seed 1")
    for b in range(0, 16, 2):
        alone = run(torch.tensor([b]), 5, f"row {b} alone, unpadded ({n_short} nodes)", nodes=n_short)
        assert torch.equal(alone[0], batch[b, : n_short + 1]), (
            f"tree row {b} (generator seed {seeds[b]}) gave {batch[b].tolist()} padded in the batch but {alone[0].tolist()} "
            "alone and unpadded: a seeded row's output must not depend on the batch's padded width or its neighbours"
        )
    reversed_out = run(everything.flip(0), 2, "reversed batch, global seed 2").flip(0)
    bad = [b for b in range(0, rows, 2) if not torch.equal(reversed_out[b], batch[b])]
    assert not bad, (
        f"seeded tree rows {bad[:5]} gave other outputs in the reversed batch (row {bad[0]}: {batch[bad[0]].tolist()} "
        f"vs {reversed_out[bad[0]].tolist()}): a seeded row's output must not depend on its position"
    )
