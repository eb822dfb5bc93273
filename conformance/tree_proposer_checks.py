"""Conformance checks of tree decoders drafting with heads or a draft model on the exactly-known pair (capabilities
``tree_proposer:medusa``, ``:eagle``, ``:eagle3``, ``:mtp``, ``:draft_model``).

``decode_tree(target, heads, prompt, depth=D, width=W, ...)`` with :class:`specdec_ref.heads.MedusaHeads` as the
draft (``specdec_ref.contract.Decoder``, "Proposers"; the reference: :mod:`specdec_ref.tree_heads`): level ``l``'s
children come from head ``l - 1``'s row (the same for every node of the level) by the declared tree scheme, the next
round's feature is the target's at the last accepted node. On ``order1-close``'s target with the exactly-known heads
(``specdec_ref.exact.heads``: head ``i``'s row is the log of the ``i + 2``-step law in eighths, read from the feature
of the token before the pending one), and with its order-1 draft model, every greedy tree is a function of the round's
text (``specdec_properties.tree_proposals.greedy_tree``), so:

* greedy, every round drafts exactly the tree the text determines and accepts exactly the path the target's argmax
  chain takes through it, and the output is the target's greedy continuation: round by round, no statistics. A
  backend claiming ``round_drafts`` reports each round's tree (tokens, parents, node probabilities), compared node by
  node; without the claim, its (node count, accepted) record. A feature read at the block's last node instead of the
  last accepted one, a head read at the wrong level, siblings not the top of their row, nodes ranked by their own
  probability instead of their path's (trees of depth 3: at depth 2 both rankings expand the same nodes), an expanded
  node fed another node's feature all change some round's tree;
* sampled, every reported tree of depth 3 follows the rule whatever was drawn (``sampled_tree_verdict``: its size, the
  nodes expanded at each level, each node's token possible and its reported probability the law's), and Medusa trees'
  continuation law is the target's.

EAGLE, EAGLE-3 and MTP heads grow EAGLE-2's dynamic trees (``decode_tree`` with the head as ``draft``): a node's
children come from the head's row after reading that node, paired with the hidden state that produced the node's own
row, and the next round's catch-up reads the committed tokens with the target's features of the accepted path. Their
exactly-known heads' rows depend on the path (``specdec_properties.proposals.EagleLaw``: the hidden state mixes every draft
before it), so a next round reading a rejected branch's features changes the trees, and an expanded node fed another
node's hidden state changes its children's row (their probabilities always, their tokens often; the acceptance of the
target's argmax chain rarely, which is why counts alone missed it: docs/proposers.md).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from specdec_ref.warp import GREEDY, SamplingConfig

from .check_helpers import (assert_continuations_follow, call_backend, decode_batch, law_in_rows_then_alike,
                            sequence_models)
from .draft_records import drafts_not_reported, reports_drafts, tree_drafts
from .proposer_checks import (GREEDY_NEW_TOKENS, GREEDY_PROMPTS, LAW_PROMPT, PROPOSER_PAIR, PROPOSER_TARGET,
                              _table_greedy, proposer_spec, proposer_target)
from .registry import CheckContext, NotApplicable, check
from .tree_decoder_checks import TreeAsChain
from . import streams

#: These checks run with the proposer checks (conformance/test_proposer.py).
FAMILY = "proposer"
#: (depth, width) of the greedy trees: a star, narrow and wide, shallow and as deep as the three heads.
TREE_SHAPES = ((1, 2), (2, 2), (3, 2), (3, 3), (2, 4))
#: The sampled law's tree: two levels of two children (the two tokens a round emits before the cut come from them),
#: its settings and the TV its test is sized for. Every decode is a tree decode of its own (no batch), so the test is
#: sized for TV 0.1 (5 946 decodes at ``ci``, about half at the early-pass look), at temperature 2, where the heads'
#: drawn rows are far from their raw ones: children reported with the untempered row's ``q``
#: (``tree_q_untempered``) move the law by TV 0.11 there (24 000 mutant decodes: 0.122 observed, of which about 0.01
#: is sampling noise), and by 0.03 to 0.05 at temperatures 0.5 to 0.8.
LAW_TREE = (2, 2)
LAW_LENGTH = 2
TREE_LAW_TV = 0.1
TREE_LAW_SAMPLING = SamplingConfig(temperature=2.0)
#: Rounds after a partial and after a full acceptance the greedy check must see (each at least).
MIN_TREE_ROUNDS = 10
#: The heads a tree decoder may draft with (``tree_proposer:KIND``), each checked on its exactly-known head.
TREE_HEADS = ("medusa", "eagle", "eagle3", "mtp")
#: Every tree drafter the checks of the drafted trees cover: the heads and an order-1 draft model of the same target,
#: :data:`TREE_DRAFT_PAIR`'s (its argmax often differs from the target's: greedy trees reach partial acceptances).
TREE_DRAFTERS = ("draft_model",) + TREE_HEADS
TREE_DRAFT_PAIR = "order1-far"
#: The sampled trees' shapes (depth 3: where a node's own probability and its path's rank the nodes differently), their
#: prompts (the first six greedy prompts, 1 to 6 tokens), settings, and the judged rounds (ties aside) each drafter's
#: case must reach.
SAMPLED_TREE_SHAPES = ((3, 2), (3, 3))
SAMPLED_TREE_PROMPTS = GREEDY_PROMPTS[:6]
SAMPLED_TREE_SAMPLING = SamplingConfig(temperature=1.0)
MIN_SAMPLED_TREE_ROUNDS = 50


def tree_drafter(kind: str, sample: bool):
    """``(target, draft spec, proposal law)`` of the tree drafter ``kind`` on :data:`PROPOSER_TARGET`: an exactly-known
    head, or :data:`TREE_DRAFT_PAIR`'s order-1 draft model (its law: the draft table's row after a node)."""
    from specdec_properties.proposals import law_of
    from specdec_properties.tree_proposals import DraftModelLaw
    from specdec_ref.exact import exact_pair

    if kind == "draft_model":
        target, draft = sequence_models(TREE_DRAFT_PAIR)
        return target, draft, DraftModelLaw(exact_pair(TREE_DRAFT_PAIR).draft.name, sample)
    spec = proposer_spec(kind, sample)
    return proposer_target(kind), spec, law_of(spec, PROPOSER_TARGET)


def _require_tree_proposer(backend, kind: str) -> None:
    if not backend.capabilities.has(f"tree_proposer:{kind}"):
        raise NotApplicable(f"backend does not claim capability tree_proposer:{kind}")


@functools.lru_cache(maxsize=None)
def _tree_law():
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_pair

    return continuation_law(exact_pair(PROPOSER_PAIR).target, list(LAW_PROMPT), LAW_LENGTH, TREE_LAW_SAMPLING)


def _tree_round_kind(previous, depth: int) -> str:
    """Where a round sits: first, after a plain step, after a partial or a full acceptance (the whole depth)."""
    if previous is None:
        return "first round"
    if not previous.proposed:
        return "after a round without drafts"
    if previous.accepted == depth:
        return f"after a full acceptance ({previous.accepted} of {depth} levels)"
    return f"after a partial acceptance ({previous.accepted} of {depth} levels)"


def _tree_rule(kind: str, text) -> str:
    """What a round's rows read, in words (for failure messages)."""
    if kind == "draft_model":
        return "the draft model's rows after the pending token and after each expanded node's token"
    note = "" if kind == "medusa" else ("; each expanded node is read with the head's hidden state that produced its "
                                        "own row")
    return (f"the round's first rows read the target's feature of position {len(text) - 2}: the last accepted node's, "
            f"not the block's last{note}")


def _drafter_name(spec) -> str:
    from specdec_ref.proposers import is_model

    return "draft model" if is_model(spec) else f"{spec.name} heads"


def _tree_of(spec) -> str:
    return "draft model's tree" if _drafter_name(spec) == "draft model" else f"{_drafter_name(spec)}' tree"


def _decode_tree(backend, target, spec, prompt, *, depth, width, max_new_tokens, sampling, generator=None):
    """``backend.decode_tree`` with its failures named (an exception is a BackendError naming the call)."""
    __tracebackhide__ = True
    result = call_backend(backend.decode_tree, target, spec, torch.tensor([list(prompt)]), depth=depth, width=width,
                          max_new_tokens=max_new_tokens, sampling=sampling, generator=generator,
                          what=f"decode_tree() with {_drafter_name(spec)} "
                          f"(prompt {list(prompt)}, depth {depth}, width {width})")
    tokens = getattr(result, "tokens", None)
    if not isinstance(tokens, list) or not all(isinstance(x, int) for x in tokens):
        raise AssertionError(f"decode_tree() must return a result whose .tokens is a list of ints, got {tokens!r}")
    return result


@check(
    guards="a head tree's next feature read at the block's last node instead of the accepted path (the tree's "
    "rollback), Medusa heads read at the wrong level, siblings not the top of their row, levels expanded by anything "
    "but the path probability (a node's own probability: deep trees), an expanded node fed another node's feature, "
    "tree rows misaligned (acceptance lost; greedy output still exact)",
    requires=("tree_decoder", "greedy"),
    cases=[(kind, {"kind": kind}) for kind in TREE_DRAFTERS],
)
def check_tree_proposer_greedy_acceptance_is_exact(backend, ctx: CheckContext, kind: str):
    """Greedy tree decoding with the exactly-known drafter ``kind``, trees of every shape in :data:`TREE_SHAPES` (depth
    1 to 3) from the greedy prompts: the output is the target's greedy continuation, and every round but the last
    drafts exactly the tree and accepts exactly the path its text determines (``specdec_properties.tree_proposals.greedy_tree``):
    node by node (token, parent, probability where reported) for a backend claiming ``round_drafts``, by (node count,
    accepted) otherwise; at least :data:`MIN_TREE_ROUNDS` rounds after a partial and as many after a full acceptance."""
    from specdec_properties.tree_proposals import greedy_tree
    from specdec_ref.exact import exact_model

    _require_tree_proposer(backend, kind)
    target, spec, law = tree_drafter(kind, False)
    table = exact_model(PROPOSER_TARGET)
    claims = reports_drafts(backend)
    seen = {"after a partial": 0, "after a full": 0, "skipped": 0, "trees compared": 0}
    for prompt in GREEDY_PROMPTS:
        want = _table_greedy(prompt, GREEDY_NEW_TOKENS)
        for depth, width in TREE_SHAPES:
            result = _decode_tree(backend, target, spec, prompt, depth=depth, width=width,
                                  max_new_tokens=GREEDY_NEW_TOKENS, sampling=GREEDY)
            where = f"{_tree_of(spec)} (depth {depth}, width {width}), greedy, prompt {list(prompt)}"
            assert result.tokens == want, (
                f"{where}: the output differs from the target's greedy continuation at position "
                f"{next((i for i, (a, b) in enumerate(zip(result.tokens, want)) if a != b), min(len(result.tokens), len(want)))}"
                f":\n  got:    {result.tokens}\n  target: {want}\n  replay: {ctx.replay}")
            full, previous = list(prompt) + list(result.tokens), None
            for r in result.rounds[:-1]:  # the last round may be cut by max_new_tokens
                text = full[: r.start]
                place = _tree_round_kind(previous, min(depth, len(getattr(spec, "lm_heads", ())) or depth))
                previous = r
                expected = greedy_tree(table, law, text, depth, width)
                if expected is None:
                    seen["skipped"] += 1
                    continue
                if claims:
                    _assert_same_tree(tree_drafts(r, where), expected, lambda: (
                        f"{where}: round {r.round} ({place}) from the text {text}",
                        f"({_tree_rule(kind, text)})\n  replay: {ctx.replay}"))
                    seen["trees compared"] += 1
                nodes = len(expected.tokens)
                assert (r.proposed, r.accepted) == (nodes, expected.accepted), (
                    f"{where}: round {r.round} ({place}) from the text {text} drafted {r.proposed} nodes and accepted "
                    f"{r.accepted}; the tree there has {nodes} nodes, of which the target's argmax chain accepts "
                    f"{expected.accepted} ({_tree_rule(kind, text)})\n  replay: {ctx.replay}")
                for key in ("after a partial", "after a full"):
                    seen[key] += place.startswith(key)
    ctx.findings.append({"kind": "coverage", **seen})
    if not claims:
        ctx.findings.append(drafts_not_reported("the greedy trees are"))
    assert min(seen["after a partial"], seen["after a full"]) >= MIN_TREE_ROUNDS, (
        f"too few rounds to check the tree's rollback ({seen}): the greedy prompts no longer reach partial and full "
        f"acceptances")


def _assert_same_tree(reported, expected, context) -> None:
    """The reported ``(tokens, parents, probabilities or None)`` of a greedy round are the exact tree's, node by node;
    the first node that differs is named (its token, its parent, then its probability); ``context()`` gives the
    failure's ``(where, because)``."""
    __tracebackhide__ = True
    from specdec_properties.tree_proposals import PROB_ATOL, PROB_RTOL

    tokens, parents, probs = reported
    if tokens == expected.tokens and parents == expected.parents and (probs is None or all(
            abs(p - q) <= PROB_ATOL + PROB_RTOL * q for p, q in zip(probs, expected.probs))):
        return
    where, because = context()
    assert len(tokens) == len(expected.tokens), (
        f"{where} drafted {len(tokens)} nodes; the rule's tree has {len(expected.tokens)}: tokens {expected.tokens}, "
        f"parents {expected.parents} {because}")
    for i, (t, p, want_t, want_p) in enumerate(zip(tokens, parents, expected.tokens, expected.parents)):
        assert (t, p) == (want_t, want_p), (
            f"{where}: node {i} is token {t} under node {p}; the rule's node {i} is token {want_t} under node {want_p} "
            f"(drafted tokens {tokens}, parents {parents}; the rule's {expected.tokens}, {expected.parents}) {because}")
        if probs is not None:
            q = expected.probs[i]
            assert abs(probs[i] - q) <= PROB_ATOL + PROB_RTOL * q, (
                f"{where}: node {i} (token {t} under node {p}) is reported with probability {probs[i]:.6g}; the "
                f"drafter's row gives it {q:.6g} (a node read with the wrong feature or path) {because}")


@check(
    guards="sampled trees not drafted by the rule: levels expanded by anything but the path probability (a node's own "
    "probability: deep trees), an expanded node fed another node's feature or a row of another path, children "
    "reported with another row than they were drawn from, nodes the rule does not draft (acceptance lost; the text "
    "law still exact)",
    requires=("tree_decoder", "sampling", "round_drafts"),
    cases=[(kind, {"kind": kind}) for kind in TREE_DRAFTERS],
)
def check_tree_proposer_sampled_trees_follow_the_rule(backend, ctx: CheckContext, kind: str):
    """Sampled tree decoding with the exactly-known drafter ``kind`` (:data:`SAMPLED_TREE_SAMPLING`, trees of depth 3
    and widths 2 and 3, one seeded decode per prompt of :data:`SAMPLED_TREE_PROMPTS` and shape): every round's reported
    tree but the last's follows the rule, whatever its draws (``specdec_properties.tree_proposals.sampled_tree_verdict``): as
    many nodes as the rule drafts, each level's expanded nodes the ``width`` of the previous level with the highest path
    probability under the drafter's law, every node's token possible in the law's row after its parent's path and,
    where the backend reports node probabilities, each equal to that row's. Deterministic: the first round and node that differ are named, with
    the seed; rounds whose expansion is a near tie are skipped (counted), at least :data:`MIN_SAMPLED_TREE_ROUNDS`
    judged."""
    from specdec_properties.tree_proposals import sampled_tree_verdict

    _require_tree_proposer(backend, kind)
    if getattr(backend.capabilities, "tree_scheme", "specinfer") == "deterministic":
        raise NotApplicable("the backend declares deterministic trees: its sampled trees are the greedy ones, checked "
                            "node by node by tree_proposer_greedy_acceptance_is_exact")
    target, spec, law = tree_drafter(kind, True)
    seen = {"judged": 0, "ties": 0}
    for prompt in SAMPLED_TREE_PROMPTS:
        for depth, width in SAMPLED_TREE_SHAPES:
            seed = ctx.seed_for("tree-proposer-rule", kind, prompt, depth, width)
            result = _decode_tree(backend, target, spec, prompt, depth=depth, width=width,
                                  max_new_tokens=GREEDY_NEW_TOKENS, sampling=SAMPLED_TREE_SAMPLING,
                                  generator=torch.Generator().manual_seed(seed))
            where = (f"{_tree_of(spec)} (depth {depth}, width {width}), {SAMPLED_TREE_SAMPLING.label()}, "
                     f"prompt {list(prompt)}, generator seed {seed}")
            full = list(prompt) + list(result.tokens)
            for r in result.rounds[:-1]:  # the last round may be cut by max_new_tokens
                text = full[: r.start]
                status, why = sampled_tree_verdict(law, text, depth, width, SAMPLED_TREE_SAMPLING, *tree_drafts(r, where))
                assert status != "violation", (
                    f"{where}: round {r.round} from the text {text}: {why}\n  drafted tokens {r.drafts}, parents "
                    f"{r.parents}\n  ({_tree_rule(kind, text)})\n  replay: {ctx.replay}")
                seen["judged" if status == "ok" else "ties"] += 1
    ctx.findings.append({"kind": "coverage", **seen})
    assert seen["judged"] >= MIN_SAMPLED_TREE_ROUNDS, (
        f"too few sampled tree rounds judged ({seen}): the prompts no longer reach enough rounds without near ties")


@check(
    guards="Medusa tree children not drawn from the row reported as their q (unprocessed head logits, settings on "
    "one side only), a tree verifier that is not exact for children drawn per node from one shared row, unverified "
    "nodes emitted",
    requires=("tree_decoder", "sampling", "tree_proposer:medusa"),
    cases=[("medusa", {})],
    statistical=True,
)
def check_tree_proposer_sequence_law(backend, ctx: CheckContext):
    """Sampled tree decoding with the exactly-known Medusa heads (children drawn from the heads' processed rows by the
    declared tree scheme, trees of :data:`LAW_TREE`) follows the target's exact law of the 2 tokens after a two-token
    prompt, power 0.99 against TV >= :data:`TREE_LAW_TV` at alpha 1e-6. A backend whose ``decode_tree_batch`` takes
    Medusa heads (``batched_tree_proposers``) answers in rows at TV ``2/3`` of that, then ``decode_tree`` seed for seed
    on the first rows (:func:`~conformance.check_helpers.law_in_rows_then_alike`)."""
    from specdec_properties.sample_size import required_samples
    from specdec_properties.sequences import law_to_cells

    if getattr(backend.capabilities, "tree_scheme", "specinfer") == "lossy":
        raise NotApplicable("the backend declares a lossy tree scheme: its text law is not claimed exact")
    target = proposer_target("medusa")
    spec = proposer_spec("medusa", True)
    law = _tree_law()
    cells = law_to_cells(law)
    probabilities = np.asarray(list(law.values()), dtype=np.float64)
    seed = ctx.seed_for("tree-proposer-law", "medusa")
    depth, width = LAW_TREE

    what = (f"Medusa trees (depth {depth}, width {width}), sampled: continuations of length {LAW_LENGTH} of "
            f"{list(LAW_PROMPT)} on {PROPOSER_PAIR} ({TREE_LAW_SAMPLING.label()})")
    sensitive_to = "Medusa children's q other than their row, unverified nodes"

    def one(gen):
        return _decode_tree(backend, target, spec, LAW_PROMPT, depth=depth, width=width, max_new_tokens=LAW_LENGTH,
                            sampling=TREE_LAW_SAMPLING, generator=gen)

    if _medusa_in_rows(backend):  # rows of decode_tree_batch, then decode_tree seed for seed (decoder_sequence_law's argument)
        rows_backend = TreeAsChain(backend, width)
        law_in_rows_then_alike(
            rows_backend, ctx, cells, key=("tree-proposer-law", seed), seed=seed, tv=TREE_LAW_TV, what=what,
            sensitive_to=sensitive_to, request=dict(prompt=list(LAW_PROMPT), max_new_tokens=LAW_LENGTH,
                                                    sampling=TREE_LAW_SAMPLING),
            samples=lambda tv: required_samples(probabilities, tv),
            rows=lambda requests, where: decode_batch(rows_backend, target, spec, requests, k=depth,
                                                      where=f"Medusa trees, {where}"),
            one=one)
        return

    def draw(_, index, size):
        return [tuple(one(torch.Generator().manual_seed(seed + i)).tokens) for i in range(index * size, (index + 1) * size)]

    n = math.ceil(required_samples(probabilities, TREE_LAW_TV) * ctx.sample_scale)
    outputs = streams.draws(ctx.streams, ("tree-proposer-law", seed), n, start=lambda: None, draw=draw, chunk=256)
    assert_continuations_follow(cells, outputs, ctx, tv=TREE_LAW_TV, seed=seed, sensitive_to=sensitive_to, what=what)


def _medusa_in_rows(backend) -> bool:
    """Whether the Medusa trees' law is drawn as rows of ``decode_tree_batch`` (the backend claims
    ``batched_tree_decoder`` with ``medusa`` among its ``batched_tree_proposers``)."""
    caps = backend.capabilities
    return (caps.has("batched_tree_decoder") and "medusa" in caps.batched_tree_proposers
            and callable(getattr(backend, "decode_tree_batch", None)))
