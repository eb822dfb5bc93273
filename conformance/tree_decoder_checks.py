"""Conformance checks of tree decoders (``backend.decode_tree``).

The tree decoder contract (``specdec_ref.contract``, capability ``tree_decoder``)::

    decode_tree(target, draft, prompt: Long[1, t], *, depth, width, max_new_tokens,
                sampling: SamplingConfig, eos_id=None, generator=None, on_round=None)
        -> specdec_ref.contract.DecodeResult

is the decoder contract with a tree of ``depth`` levels of ``width`` children per round in place
of a chain of ``k`` drafts: greedy decoding equals AR greedy decoding, sampled decoding follows the
target's law exactly for the declared (lossless) ``tree_scheme``, EOS / ``max_new_tokens`` as for
chains, and (claiming ``cache``) after every round ``on_round(record, target_cache, draft_cache)``
sees both caches holding exactly the committed tokens but the pending one.

These checks run the chain decoder checks' own machinery (``conformance.decoder_checks``: the same
models, prompts, oracles, flip classification, cache hook and sequence-law cases) on the tree
decoder through :class:`TreeAsChain`, which answers ``decode(..., k=K)`` with
``decode_tree(..., depth=K, width=W)``: in their messages ``k`` is the tree depth.

See ``tests/test_tree_decode.py`` for the unit tests.
"""
from __future__ import annotations

import functools

import torch

from specdec_properties.sampling import call_backend
from specdec_ref.decode import autoregressive_decode
from specdec_ref.models import make_draft, tiny_lm
from specdec_ref.warp import GREEDY, SamplingConfig

from .check_helpers import (
    EFFICIENCY_NEW_TOKENS,
    EFFICIENCY_PAIR,
    FILTERED_EFFICIENCY,
    _cache_hook,
    _decode,
    _greedy_equality,
    _require_filters,
    assert_numerical_flip,
    efficiency_tables,
    look_prompts,
    round_totals,
    sequence_models,
)
from . import streams
from .decoder_checks import SEQUENCE_TV, check_decoder_cache_matches_prefill_every_round, check_decoder_sequence_law
from .registry import CheckContext, NotApplicable, check

#: Tree widths the greedy and cache checks use (each with the chain checks' k grid as depths: greedy
#: 1, 2, 4, 8; cache 1, 3, 5), so stars (depth 1) and deep bushy trees are both covered.
TREE_WIDTHS = (2, 3)
#: Width of the bf16 and sequence-law trees (two siblings: the residual chain of the tree schemes is exercised).
LAW_WIDTH = 2
#: The sequence-law cases run on trees (``decoder_checks.SEQUENCE_CASES``) and the TV each is sized for (power 0.99 at
#: alpha 1e-6):
#:
#: * ``position`` at SEQUENCE_TV (0.045): misplaced K/V entries or position ids after compaction;
#: * ``position_limit`` at 0.09: the 126-token prompt runs into the 128 positions, so the tree shrinks to one level of
#:   two nodes and a round after an acceptance has no room for a tree at all (a plain target step). A plain step that
#:   takes the argmax instead of sampling (``tree_greedy_fallback_at_position_limit``) moves the law by TV 0.134 exactly
#:   (every 3-token continuation's last token comes from that step; tests/test_tree_decode.py); the ``position`` case
#:   ends far below the limit, and ``tree_decoder_position_limit`` tests no law. At 0.09 the case draws 2 951 tree decodes at ``ci`` (8 220 at 0.045), each prefilling 125
#:   tokens; a correct backend usually passes at an early-pass look (5 CPU-s for the reference).
TREE_SEQUENCE_CASES = {"position": SEQUENCE_TV, "position_limit": 0.09}


class TreeAsChain:
    """A tree decoder seen as a chain decoder: ``decode(..., k=K, ...)`` calls ``decode_tree(..., depth=K, width=width, ...)``;
    for a backend claiming ``batched_tree_decoder``, ``decode_batch(..., k=K)`` calls ``decode_tree_batch`` (its rows
    then answer ``decoder_sequence_law``: :func:`~conformance.decoder_checks.answers_in_rows`)."""

    def __init__(self, backend, width: int):
        self.backend = backend
        self.width = width
        self.name = getattr(backend, "name", "?")
        self.capabilities = backend.capabilities
        self.call_names = ("decode_tree()", "decode_tree_batch()")
        self.answers_in_rows = backend.capabilities.has("batched_tree_decoder") and callable(
            getattr(backend, "decode_tree_batch", None))

    def decode(self, target, draft, prompt, *, k, **kwargs):
        return self.backend.decode_tree(target, draft, prompt, depth=k, width=self.width, **kwargs)

    def decode_batch(self, target, draft, requests, *, k, **kwargs):
        return self.backend.decode_tree_batch(target, draft, requests, depth=k, width=self.width, **kwargs)


def _as_tree(run, width: int):
    """Run a chain-decoder check body on :class:`TreeAsChain`; a failure notes that its ``k`` is the tree depth."""
    __tracebackhide__ = True
    try:
        return run()
    except AssertionError as exc:
        exc.add_note(f"(tree decoder: decode_tree with width={width}; 'k' above is the tree depth)")
        raise


@check(
    guards="tree attention mask wrong (a node seeing siblings or cousins), node position ids not by depth, target rows "
    "not aligned with nodes (row i+1 = node i), wrong path compaction, tokens dropped or duplicated, wrong max_new_tokens",
    requires=("tree_decoder", "greedy"),
    cases=[(arch, {"arch": arch}) for arch in ("llama", "qwen2")],
)
def check_tree_decoder_greedy_equals_ar_fp32(backend, ctx: CheckContext, arch: str):
    """In float32, greedy tree decoding equals AR greedy decoding token for token.

    Trees of width 2 and 3 with depth 1 (stars), 2, 4 and 8, over the chain check's draft families
    (identical, noisy, independent) and prompts; only a classified numerical flip is tolerated.
    """
    for width in TREE_WIDTHS:
        _as_tree(lambda: _greedy_equality(TreeAsChain(backend, width), ctx, arch, "float32", max_new=24), width)


@check(
    guards="algorithmic tree-decoding divergences hidden behind 'bf16 noise': every bf16 mismatch must be a classified near-tie",
    requires=("tree_decoder", "greedy", "dtype:bfloat16"),
    cases=[(arch, {"arch": arch}) for arch in ("llama", "gpt2")],
)
def check_tree_decoder_greedy_bf16_divergences_are_flips(backend, ctx: CheckContext, arch: str):
    """In bfloat16, every divergence of greedy tree decoding (width 2, depth 1, 2, 4, 8) from AR greedy is a
    numerical flip (top-1/top-2 gap within the bf16 tolerance; ``specdec_properties.flips``)."""
    # the tolerated flips are recorded in ctx.findings (hypothesis.note would raise outside a Hypothesis test)
    _as_tree(lambda: _greedy_equality(TreeAsChain(backend, LAW_WIDTH), ctx, arch, "bfloat16", max_new=24), LAW_WIDTH)


@check(
    guards="KV compaction copying the wrong slots (e.g. assuming the accepted path is a dense prefix of the node order), "
    "rejected branches left cached, nodes written with flat instead of depth position ids, path nodes the draft never "
    "fed left out of its cache, tokens past EOS cached",
    requires=("tree_decoder", "cache"),
    cases=[(f"{arch}-{mode}", {"arch": arch, "mode": mode}) for arch in ("llama", "qwen2", "gpt2") for mode in ("greedy", "sampling")],
)
def check_tree_decoder_cache_matches_prefill_every_round(backend, ctx: CheckContext, arch: str, mode: str):
    """After every round both caches hold exactly the committed tokens but the pending one: lengths agree and every
    layer's K/V equals a fresh prefill of that prefix (the chain check's hook, trees of width 2 and 3, depth 1, 3, 5)."""
    for width in TREE_WIDTHS:
        _as_tree(lambda: check_decoder_cache_matches_prefill_every_round(TreeAsChain(backend, width), ctx, arch, mode), width)


@check(
    guards="any loss of exactness of tree decoding on real checkpoints: siblings not drafted as the declared tree scheme "
    "requires, q not the row a node was drawn from, stale or misplaced KV entries after compaction, wrong position ids, "
    "a node attending outside its path, a different token fed to the next round than the one emitted",
    requires=("tree_decoder", "sampling"),
    cases=[(name, {"case": name, "tv": tv}) for name, tv in TREE_SEQUENCE_CASES.items()],
    statistical=True,
)
def check_tree_decoder_sequence_law(backend, ctx: CheckContext, case: str, tv: float):
    """Whole continuations decoded with trees (width 2, depth = the case's k) on an exactly-known checkpoint pair
    follow the exact law from its tables: ``decoder_sequence_law``'s test (N decodes with power 0.99 against every
    law at TV >= the case's TV in ``TREE_SEQUENCE_CASES``, alpha 1e-6).

    Case ``position``: the order-2, position-dependent target (its logits read the previous token through
    attention over the KV cache and the parity of the position through RoPE), so a misplaced K/V entry after
    compaction or a node written at the wrong position changes the law. N = 7 958 at the ``ci`` profile. A backend
    claiming ``batched_tree_decoder`` answers in rows of ``decode_tree_batch`` at TV ``2/3 tv`` and then ``decode_tree``
    seed for seed on the first rows (``decoder_sequence_law``'s argument, :func:`~conformance.decoder_checks.rows_law_then_decodes_alike`).
    Case ``position_limit``: the same pair at its 128 positions, where the tree shrinks and then gives way to plain
    target steps (``TREE_SEQUENCE_CASES`` states the effect of a wrong plain step there).
    """
    if getattr(backend.capabilities, "tree_scheme", "specinfer") == "lossy":
        raise NotApplicable("the backend declares a lossy tree scheme: its text law is not claimed exact")
    _as_tree(lambda: check_decoder_sequence_law(TreeAsChain(backend, LAW_WIDTH), ctx, case, tv), LAW_WIDTH)


#: ``tree_decoder_position_limit``: a Llama target of this many positions (and a noisy draft of it), prompts ending
#: ``j = 1 .. LIMIT_DISTANCES`` positions below it, decoded to the limit (``max_new_tokens = j + 1``: the last token is
#: never fed), with trees whose shape leaves rooms of every size along the way.
LIMIT_POSITIONS = 32
LIMIT_DISTANCES = 8
LIMIT_TREES = ((3, 2), (2, 3), (1, 4))  # (depth, width): 10, 12 and 4 nodes, shrunk level by level, then width by width


@functools.lru_cache(maxsize=None)
def limit_pair():
    """The position-limit check's models (cached; treat as read-only)."""
    target = tiny_lm("llama", vocab_size=16, seed=21, init_scale=2.0, max_positions=LIMIT_POSITIONS)
    return target, make_draft(target, "noisy", noise=0.1, seed=22)


@check(
    guards="trees not shrunk to the room left at the models' maximum positions (nodes written past the cache), that "
    "room counted without the pending token's slot, a wrong plain target step where no tree fits, caches wrong there",
    requires=("tree_decoder", "greedy"),
)
def check_tree_decoder_position_limit(backend, ctx: CheckContext):
    """Tree decodes that run into the models' maximum positions: greedy equals AR greedy token for token (a classified
    numerical flip is tolerated), and with ``sampling`` claimed a sampled decode keeps the stop invariants; claiming
    ``cache``, both caches equal a fresh prefill after every round. Prompts end j = 1..8 positions below the
    32-position limit, trees of (depth, width) (3, 2), (2, 3) and (1, 4), so rounds get fewer levels, fewer
    children and no tree at all (tests/test_tree_decode.py checks that the reference's decodes here have all three).
    A tree one node too large for the room left (``tree_room_ignores_pending``) writes past the cache: a named error
    of the backend call. The sequence law's ``position_limit`` case reaches the limit too, but only with rooms of 3
    and 1 slots (a rejection there emits EOS), where that miscount changes nothing.
    """
    target, draft = limit_pair()
    claims_cache = bool(getattr(backend.capabilities, "cache", False))
    claims_sampling = bool(getattr(backend.capabilities, "sampling", False))
    g = torch.Generator().manual_seed(ctx.seed_for("tree-limit-prompts"))
    for j in range(1, LIMIT_DISTANCES + 1):
        prompt = torch.randint(0, 16, (1, LIMIT_POSITIONS - j), generator=g)
        ar = autoregressive_decode(target, prompt, max_new_tokens=j + 1)
        for depth, width in LIMIT_TREES:
            chain = TreeAsChain(backend, width)
            where = f"prompt of {LIMIT_POSITIONS - j} tokens ({j} below the {LIMIT_POSITIONS} positions), depth {depth}, width {width}"
            runs = [("greedy", GREEDY, None)]
            if claims_sampling:
                runs.append(("sampling", SamplingConfig(temperature=0.9), ctx.seed_for("tree-limit-run", j, depth)))
            for mode, sampling, seed in runs:
                run = dict(k=depth, max_new_tokens=j + 1, sampling=sampling)
                gen = (lambda: None) if seed is None else (lambda: torch.Generator().manual_seed(seed))
                got = _as_tree(lambda: _decode(chain, target, draft, prompt, generator=gen(), **run), width)
                if mode == "greedy" and got.tokens != ar.tokens:
                    assert_numerical_flip(target, prompt, got.tokens, ar.tokens, "float32", where, ctx)
                if claims_cache:  # the same decode again, both caches compared with a fresh prefill after every round
                    label = where + f", {mode}" + ("" if seed is None else f", generator seed {seed}")
                    hook = _cache_hook(target, draft, prompt[0].tolist() + got.tokens, label)
                    again = _as_tree(lambda: _decode(chain, target, draft, prompt, generator=gen(), on_round=hook, **run), width)
                    assert again.tokens == got.tokens, f"{label}: the same decode gave {got.tokens}, then {again.tokens}"


#: ``tree_decoder_acceptance_under_filters``: trees of width 2 and depth 2 (a full binary tree of 6 nodes: both level-1
#: nodes are expanded, so the shape is fixed and its round law exact), 60 decodes of 64 tokens per case (about 1 700-3 600
#: rounds). The cases are ``decoder_checks.FILTERED_EFFICIENCY``'s.
TREE_EFFICIENCY_WIDTH = 2
TREE_EFFICIENCY_DEPTH = 2
TREE_EFFICIENCY_DECODES = 60


@check(
    guards="tree drafting that loses (or moves) acceptance without bias where the order of temperature and filters "
    "matters: the draft drawing children from a differently warped distribution than the declared one while reporting "
    "that q honestly",
    requires=("tree_decoder", "sampling"),  # top_k / top_p / min_p per case: a case using an unclaimed filter is skipped
    cases=[(name, {"case": name}) for name in FILTERED_EFFICIENCY],
    statistical=True,
)
def check_tree_decoder_acceptance_under_filters(backend, ctx: CheckContext, case: str):
    """Accepted path length per round of tree decoding (width 2, depth 2) on ``order1-far`` against the declared tree
    scheme's exact expectation given the round's last token (``specdec_properties.tree_exact.tree_accepted_moments`` on the
    warped tables; normal test of the total), at the chain's three filter cases.

    The representative deviation (children drawn from ``softmax(filters(z) / T)`` with that q reported, SpecInfer trees)
    moves the exact mean accepted per round along the decodes from 0.056 to 0.507 (cold: T 0.5, top-k 4, top-p 0.7),
    1.160 to 1.007 (hot: T 1.5, top-k 4, top-p 0.9) and 1.287 to 1.085 (min_p: T 1.5, min-p 0.1): +160, -8 and -10
    standard errors of the case's total (tests/test_tree_decode.py). Schemes whose siblings can exhaust a filtered row
    (``recursive``: the exact round law has no tree there) are not applicable.
    """
    from specdec_properties.stats import assert_total
    from specdec_properties.tree_exact import kary, tree_accepted_moments

    sampling, _ = FILTERED_EFFICIENCY[case]
    _require_filters(backend, sampling, case)
    scheme = getattr(backend.capabilities, "tree_scheme", "specinfer")
    if scheme == "lossy":
        raise NotApplicable("the backend declares a lossy tree scheme: it claims no exact acceptance law")
    tables = efficiency_tables(EFFICIENCY_PAIR, sampling)
    moments = {}
    for depth in range(1, TREE_EFFICIENCY_DEPTH + 1):  # rounds near max_new_tokens have fewer levels
        shape = kary(TREE_EFFICIENCY_WIDTH, depth)
        try:
            moments[len(shape)] = tree_accepted_moments(scheme, shape, tables)
        except ValueError as exc:
            raise NotApplicable(f"tree scheme {scheme} at {sampling.label()}: {exc}") from None
    target, draft = sequence_models(EFFICIENCY_PAIR)
    seed = ctx.seed_for(f"tree-efficiency-{case}")
    starts, rows = look_prompts(ctx, f"tree-efficiency-{case}-prompts", TREE_EFFICIENCY_DECODES, tables.vocab)

    def decode(gen, i, size):  # decode i uses prompt i; a later look continues the earlier one's generator
        return [call_backend(
            backend.decode_tree, target, draft, starts[i][None, :], depth=TREE_EFFICIENCY_DEPTH, width=TREE_EFFICIENCY_WIDTH,
            max_new_tokens=EFFICIENCY_NEW_TOKENS, sampling=sampling, generator=gen,
            what=f"decode_tree() (prompt {starts[i].tolist()}, {sampling.label()})",
        )]

    results = streams.draws(ctx.streams, ("tree-efficiency", case, seed), rows,
                            start=lambda: torch.Generator().manual_seed(seed), draw=decode)

    def moments_of(nodes: int):
        assert nodes in moments, (
            f"a round with {nodes} tree nodes: a width-{TREE_EFFICIENCY_WIDTH} tree of depth <= {TREE_EFFICIENCY_DEPTH} "
            f"has {sorted(moments)}"
        )
        return moments[nodes]

    accepted, means, variances = round_totals(starts[:rows].tolist(), results, moments_of)
    ctx.record(assert_total(
        accepted, means, variances, unit="accepted nodes",
        what=f"accepted path length per tree round (width {TREE_EFFICIENCY_WIDTH}, depth {TREE_EFFICIENCY_DEPTH}) vs the "
        f"exact expectation of the declared tree scheme ({scheme}) on {EFFICIENCY_PAIR} at {sampling.label()}",
    ))
