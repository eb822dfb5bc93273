"""Conformance checks of decoders drafting with proposers other than a draft model (capability ``proposer:NAME``).

The proposers (``specdec_ref.contract.Decoder``, "Proposers"): prompt lookup (``ngram``), EAGLE heads (``eagle``),
EAGLE-3 heads (``eagle3``), MTP modules (``mtp``) and Medusa heads (``medusa``), passed as ``draft`` to ``decode`` /
``decode_batch``. On the exactly-known order-1 pair ``order1-close`` with the exactly-known heads
(``specdec_ref.exact.heads``; EAGLE-3 on the three-layer target of the same table, ``specdec_ref.exact.deep``, whose
layers' hidden states differ) every proposal is a table of what the proposer reads (its pending token, the feature
of the position before it, its earlier drafts, the text), so:

* greedy decoding equals the target's greedy continuation (from the table), whatever the proposer;
* with greedy target rows and argmax drafts, every round's drafts and accepted count are a function of its text
  (``specdec_properties.proposals.greedy_round``): checked round by round, no statistics. A proposer that reads a feature of
  the wrong position, keeps features of rejected drafts, reads a head at the wrong offset or looks up the wrong text
  proposes other tokens; a backend claiming ``round_drafts`` reports them (``RoundRecord.drafts``), and the first
  round and draft that differ are named whatever the counts (a draft after the first rejected one changes no count),
  with whether the round followed a partial or a full acceptance (rollback and bonus-feature bugs show there only);
  without the claim, the first round whose counts differ;
* sampled, the continuation law is the target's (q reported must be what the drafts were drawn from), and the
  accepted drafts at each draft position total their exact expectation (``specdec_properties.proposals.round_acceptance``:
  the per-round law of the accepted count given the round's text, under the declared scheme); every round proposes
  exactly the rule's number of drafts (``law.count``: prompt lookup's for its text, ``k`` for a head), and argmax
  drafts, a function of the text at any temperature, equal the rule's where the backend reports them.

With greedy (one-hot) drafts the output law is the target's whatever the proposer does, which is why the acceptance
checks exist: they are the detector for proposer bugs, which cost speed, not exactness.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from specdec_ref.contract import Request
from specdec_ref.warp import GREEDY, SamplingConfig

from .check_helpers import _decode, assert_continuations_follow, decode_batch, sequence_models
from .draft_records import chain_drafts, drafts_not_reported, first_difference, reports_drafts
from .registry import CheckContext, NotApplicable, check, exact_scheme
from . import streams

#: The exactly-known pair the proposers draft for (its target's features are ``4 e_t``, the heads' tables read them).
PROPOSER_PAIR = "order1-close"
PROPOSER_TARGET = "order1-target"
#: Draft length of every check (Medusa: three heads).
PROPOSER_K = 3
#: Proposers the checks cover, with the drafts each proposes in the sampled checks: sampled from the head's law
#: (``q`` reported) or its argmax (one-hot).
PROPOSERS = ("ngram", "eagle", "eagle3", "mtp", "medusa")

#: Greedy checks: prompts of 1 to 6 tokens (a one-token prompt's first round drafts nothing), some repetitive (so
#: prompt lookup finds matches), 24 new tokens, k = 1..3.
GREEDY_PROMPTS = ((3,), (5, 2), (1, 2, 1, 2), (0, 1, 0, 1, 0, 1), (6, 4, 6), (2, 3, 5, 2, 3), (4, 4, 4), (1, 5, 0, 6, 2, 4),
                  (0,), (3, 6, 3, 6, 3))
GREEDY_NEW_TOKENS = 24


def proposer_target(kind: str):
    """The target model ``kind`` drafts for: :data:`PROPOSER_PAIR`'s float32 target, or for EAGLE-3 (which fuses
    several layers) the deep target of the same table (``specdec_ref.exact.deep``: the same law, layers that differ)."""
    if kind == "eagle3":
        from specdec_ref.exact.deep import deep_target

        return deep_target(PROPOSER_TARGET, layers=3)
    return sequence_models(PROPOSER_PAIR)[0]


@functools.lru_cache(maxsize=None)
def proposer_spec(kind: str, sample: bool):
    """The exactly-known spec of ``kind`` on :func:`proposer_target` (cached; read-only)."""
    from specdec_ref.exact.heads import exact_eagle3_head, exact_eagle_head, exact_medusa_heads, exact_mtp_head
    from specdec_ref.proposers import Ngram

    target = proposer_target(kind)
    if kind == "ngram":
        return Ngram(1, 3)
    if kind == "eagle":
        return exact_eagle_head(target, PROPOSER_TARGET, sample=sample)
    if kind == "eagle3":
        return exact_eagle3_head(target, PROPOSER_TARGET, sample=sample)
    if kind == "mtp":
        return exact_mtp_head(target, PROPOSER_TARGET, sample=sample)
    if kind == "medusa":
        return exact_medusa_heads(target, PROPOSER_TARGET, heads=PROPOSER_K, sample=sample)
    raise ValueError(f"unknown proposer kind {kind!r}")


def _table_greedy(prompt, n: int) -> list[int]:
    """The target's greedy continuation of ``prompt`` from its table (first-index argmax)."""
    from specdec_ref.exact import exact_model

    m = exact_model(PROPOSER_TARGET)
    out, last = [], prompt[-1]
    for _ in range(n):
        last = int(np.asarray(m.next_logits([[last]]))[0].argmax())
        out.append(last)
    return out


def _round_kind(previous) -> str:
    if previous is None:
        return "first round"
    if not previous.proposed:
        return "after a round without drafts"
    if previous.proposed and previous.accepted == previous.proposed:
        return f"after a full acceptance ({previous.accepted} of {previous.proposed})"
    return f"after a partial acceptance ({previous.accepted} of {previous.proposed})"


@check(
    guards="drafts from a proposer corrupting the text: proposals judged against the wrong target rows, a head's or a "
    "lookup's drafts emitted unverified, tokens dropped or duplicated around a proposer's short or empty proposals",
    requires=("decoder", "greedy"),
    cases=[(kind, {"kind": kind}) for kind in PROPOSERS],
)
def check_proposer_greedy_equals_ar(backend, ctx: CheckContext, kind: str):
    """Greedy decoding with each proposer (argmax drafts) equals the target's greedy continuation from its table, for
    k = 1, 2, 3 and prompts of 1 to 6 tokens."""
    _require(backend, kind)
    target = proposer_target(kind)
    spec = proposer_spec(kind, False)
    for prompt in GREEDY_PROMPTS:
        want = _table_greedy(prompt, GREEDY_NEW_TOKENS)
        for k in (1, 2, 3):
            got = _decode(backend, target, spec, torch.tensor([prompt]), k=k, max_new_tokens=GREEDY_NEW_TOKENS,
                          sampling=GREEDY).tokens
            assert got == want, (
                f"greedy decoding with the {kind} proposer (k={k}, prompt {list(prompt)}) differs from the target's "
                f"greedy continuation at position {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}:\n"
                f"  got:    {got}\n  target: {want}\n  replay: {ctx.replay}"
            )


@check(
    guards="proposer state not following the committed text: a feature of the previous position, features of rejected "
    "drafts kept after a rejection, the bonus token paired with the wrong feature, an EAGLE-3 feature fused from the "
    "wrong target layers, a draft-vocabulary map (d2t) off by one, an MTP module's position-0 mask, a Medusa head read "
    "at the wrong offset, prompt lookup matching the wrong occurrence or on a text missing the bonus token, later "
    "draft steps reading the wrong state (drafts that change no count; acceptance lost, output still exact)",
    requires=("decoder", "greedy"),
    cases=[(kind, {"kind": kind}) for kind in PROPOSERS],
)
def check_proposer_greedy_acceptance_is_exact(backend, ctx: CheckContext, kind: str):
    """Greedy, with argmax drafts, every drafted round drafts exactly the tokens its text determines and accepts
    exactly the count the target's argmax gives them (``specdec_properties.proposals.greedy_round``: the proposer's table
    drafts judged against the target's argmax); a backend claiming ``round_drafts`` is judged on every round's drafts
    (the last round's may stop early, never go past or differ), one that does not on the counts; every round checked
    (rounds with a tied row are skipped, counted), at least :data:`MIN_GREEDY_ROUNDS` of them after a partial
    acceptance and as many after a full one."""
    from specdec_properties.proposals import greedy_round, law_of
    from specdec_ref.exact import exact_model

    _require(backend, kind)
    target = proposer_target(kind)
    spec = proposer_spec(kind, False)
    law, table = law_of(spec, PROPOSER_TARGET), exact_model(PROPOSER_TARGET)
    claims = reports_drafts(backend)
    seen = {"after a partial": 0, "after a full": 0, "skipped": 0, "drafts compared": 0}
    for prompt in GREEDY_PROMPTS:
        for k in (1, 2, 3):
            result = _decode(backend, target, spec, torch.tensor([prompt]), k=k, max_new_tokens=GREEDY_NEW_TOKENS,
                             sampling=GREEDY)
            full = list(prompt) + list(result.tokens)
            label = f"{kind} proposer, greedy, k={k}, prompt {list(prompt)}"
            previous = None
            for r in result.rounds:
                text = full[: r.start]
                expected = greedy_round(table, law, text, k)
                where = _round_kind(previous)
                previous = r
                if expected is None:
                    seen["skipped"] += 1
                    continue
                drafts, accepted = expected
                last_round = r is result.rounds[-1]  # the last round may be cut by max_new_tokens
                if claims:
                    got = chain_drafts(r, label)
                    i = first_difference(got, drafts if not last_round else drafts[: len(got)])
                    assert i is None, (
                        f"{label}: round {r.round} ({where}) from the text {text} drafted {got}; the proposer's rule "
                        f"drafts {drafts} there: {_draft_difference(got, drafts, i)} (proposed {r.proposed}, accepted "
                        f"{r.accepted}; the rule's drafts accept {accepted}) {_exact_state(text, ctx)}")
                    seen["drafts compared"] += 1
                if not last_round:
                    assert (r.proposed, r.accepted) == (len(drafts), accepted), (
                        f"{label}: round {r.round} ({where}) from the text {text} proposed {r.proposed} and accepted "
                        f"{r.accepted}; the proposer's rule drafts {drafts} there, of which the target accepts "
                        f"{accepted} {_exact_state(text, ctx)}")
                for key in ("after a partial", "after a full"):
                    seen[key] += where.startswith(key)
    ctx.findings.append({"kind": "coverage", **seen})
    if not claims:
        ctx.findings.append(drafts_not_reported("the greedy rounds' drafts are"))
    assert min(seen["after a partial"], seen["after a full"]) >= MIN_GREEDY_ROUNDS, (
        f"too few rounds to check rollback ({seen}): the greedy prompts no longer reach partial and full acceptances")


#: Rounds after a partial and after a full acceptance the greedy check must see (each at least).
MIN_GREEDY_ROUNDS = 10


def _exact_state(text, ctx: CheckContext) -> str:
    return (f"(the exact proposer state is the committed text: the feature of position {len(text) - 2} for heads, the "
            f"whole text for lookup)\n  replay: {ctx.replay}")


def _draft_difference(got: list, want: list, i: int) -> str:
    """Draft ``i`` of a round, got against the rule's, in words."""
    mine = got[i] if i < len(got) else "missing"
    rule = want[i] if i < len(want) else "none (past the rule's count)"
    return f"draft {i} is {mine}, the rule's {rule}"


def _require(backend, kind: str) -> None:
    if not backend.capabilities.has(f"proposer:{kind}"):
        raise NotApplicable(f"backend does not claim capability proposer:{kind}")


def _decode_rows(backend, target, spec, requests, k: int, where: str):
    """Results of ``requests``: rows of ``decode_batch`` when the backend claims it, else one ``decode`` each."""
    if backend.capabilities.has("batched_decoder") and callable(getattr(backend, "decode_batch", None)):
        return decode_batch(backend, target, spec, requests, k=k, where=where)
    return [_decode(backend, target, spec, torch.tensor([r.prompt]), k=k, max_new_tokens=r.max_new_tokens,
                    sampling=r.sampling, eos_id=r.eos_ids, generator=r.generator) for r in requests]


#: The sampled checks' settings: temperature 0.8 (the draft law must be processed like the target's).
PROPOSER_SAMPLING = SamplingConfig(temperature=0.8)
#: Sequence law: continuations of 2 tokens after a two-token prompt (so heads have a feature in the first round).
LAW_PROMPT = (2, 5)
LAW_LENGTH = 2
LAW_TV = 0.05
#: Acceptance: decodes of this many new tokens from random 2-4 token prompts.
ACCEPT_NEW_TOKENS = 24
#: The shift of the mean accepted count per round, at a draft position, detected with power 0.99 at alpha 1e-6.
ACCEPT_SHIFT = 0.05
ROW_CHUNK = 256


@functools.lru_cache(maxsize=None)
def _law(length: int):
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_pair

    return continuation_law(exact_pair(PROPOSER_PAIR).target, list(LAW_PROMPT), length, PROPOSER_SAMPLING)


@check(
    guards="a sampled proposer reporting another q than its drafts were drawn from (unprocessed head logits, settings "
    "applied on one side only), drafts emitted unverified, rows' proposals mixed up",
    requires=("decoder", "sampling"),
    cases=[(kind, {"kind": kind}) for kind in PROPOSERS],
    statistical=True,
)
def check_proposer_sequence_law(backend, ctx: CheckContext, kind: str):
    """Sampled decoding with each proposer (heads drawing their drafts from their processed law) follows the target's
    exact law of the 3 tokens after a two-token prompt, power 0.99 against TV >= :data:`LAW_TV`."""
    from specdec_properties.sample_size import required_samples
    from specdec_properties.sequences import law_to_cells

    _require(backend, kind)
    target = proposer_target(kind)
    spec = proposer_spec(kind, True)
    law = _law(LAW_LENGTH)
    cells = law_to_cells(law)
    n = math.ceil(required_samples(np.asarray(list(law.values()), dtype=np.float64), LAW_TV) * ctx.sample_scale)
    seed = ctx.seed_for("proposer-law", kind)

    def draw(_, index, size):
        rows = range(index * size, (index + 1) * size)
        reqs = [Request(prompt=list(LAW_PROMPT), max_new_tokens=LAW_LENGTH, sampling=PROPOSER_SAMPLING, seed=seed + i)
                for i in rows]
        return [tuple(r.tokens) for r in _decode_rows(backend, target, spec, reqs, PROPOSER_K, f"{kind}, rows {rows[0]}..")]

    outputs = streams.draws(ctx.streams, ("proposer-law", kind, seed), n, start=lambda: None, draw=draw, chunk=ROW_CHUNK)
    assert_continuations_follow(
        cells, outputs, ctx, tv=LAW_TV, seed=seed, sensitive_to="q reported other than the drafts' law, unverified drafts",
        what=f"{kind} proposer, sampled: continuations of length {LAW_LENGTH} of {list(LAW_PROMPT)} on {PROPOSER_PAIR} "
        f"({PROPOSER_SAMPLING.label()}, k={PROPOSER_K})",
    )


#: ``{(law, scheme): {round key: law of m}}``: the exact round laws computed so far (a few dozen distinct starts).
_ROUND_LAWS: dict = {}
#: ``{law: {round key: (count, argmax drafts or None)}}``: the rule's number of drafts at a round and, for a one-hot
#: proposer, the drafts themselves (both a function of the round key).
_ROUND_RULES: dict = {}


def _rule(law, text) -> tuple[int, list[int] | None]:
    """The rule's number of drafts at a round from ``text`` (``law.count``) and, for a one-hot proposer, its drafts
    (None for sampled drafts, or where a tied row makes them ambiguous)."""
    from specdec_properties.proposals import argmax_drafts

    return law.count(text, PROPOSER_K), (argmax_drafts(law, text, PROPOSER_K) if law.one_hot else None)


def _assert_round_follows_rule(r, rule, text, compare_drafts: bool, last: bool, ctx: CheckContext, label: str) -> None:
    """A sampled round proposes the rule's number of drafts (the last round, cut by ``max_new_tokens``, may propose
    fewer: never more) and, with ``compare_drafts``, the rule's drafts (``rule = (count, drafts or None)``)."""
    __tracebackhide__ = True
    count, drafts = rule
    assert r.proposed == count or (last and r.proposed < count), (
        f"{label}: round {r.round} from the text {text} proposed {r.proposed} drafts; the proposer's rule proposes "
        f"{count} there{'' if drafts is None else f' ({drafts})'} (prompt lookup: the tokens after the first earlier "
        f"occurrence of the longest matching suffix, fewer at the text's end, none without a match; a head: k once it "
        f"has a feature){'; drafts past the rule are never proposed' if r.proposed > count else ''}\n"
        f"  replay: {ctx.replay}")
    if compare_drafts and drafts is not None:
        got = chain_drafts(r, label)
        i = first_difference(got, drafts[: len(got)])
        assert i is None, (
            f"{label}: round {r.round} from the text {text} drafted {got}; the proposer's rule drafts {drafts} there "
            f"(argmax drafts: a function of the text at any temperature): {_draft_difference(got, drafts, i)}\n"
            f"  replay: {ctx.replay}")


def _accept_rounds(ctx: CheckContext, shift: float) -> int:
    """Rounds for power 0.99 against ``shift`` per round at alpha 1e-6 (an accepted indicator's variance <= 1/4)."""
    from specdec_properties.stats import ALPHA, TARGET_POWER
    from scipy import stats

    z = stats.norm.isf(ALPHA / 2) + stats.norm.isf(1 - TARGET_POWER)
    return math.ceil((z * 0.5 / shift) ** 2)


@check(
    guards="proposer state not following the committed text, sampled (a feature of the previous position, features of "
    "rejected drafts kept, the bonus token's feature, EAGLE-3 layers or d2t wrong, a head at the wrong offset, lookup "
    "on the wrong text) and a "
    "sampled proposer's q not the law its drafts came from: acceptance lost or inflated while the output stays exact; "
    "a round proposing another number of drafts than the rule (short lookups padded to k, lookups not tried, drafts "
    "past the rule's count) or, reported, other argmax drafts",
    requires=("decoder", "sampling"),
    cases=[(f"{kind}-{mode}", {"kind": kind, "sample": mode == "sampled"})
           for kind, modes in (("ngram", ("one_hot",)), ("eagle", ("sampled", "one_hot")), ("eagle3", ("one_hot",)),
                               ("mtp", ("one_hot",)), ("medusa", ("one_hot",)))
           for mode in modes],
    statistical=True,
)
def check_proposer_acceptance_is_exact(backend, ctx: CheckContext, kind: str, sample: bool):
    """Sampled decoding with each proposer: at each draft position ``i``, the rounds whose first ``i`` drafts were
    accepted total their exact expectation (the sum over rounds of ``P(m >= i)`` given the round's text, the declared
    scheme's law, ``specdec_properties.proposals.round_acceptance``); power 0.99 against a shift of :data:`ACCEPT_SHIFT` per
    round at any position; the failure report breaks the totals down by rounds after a partial and after a full
    acceptance (where rollback bugs show). Every round, drafted or not, proposes exactly the rule's number of drafts
    (``law.count``: prompt lookup's for the round's text, ``k`` for a head; the last round may propose fewer, never
    more), and argmax drafts equal the rule's where the backend claims ``round_drafts``: both deterministic, the first
    round that differs named."""
    from specdec_properties.proposals import law_of, round_acceptance, round_key
    from specdec_properties.stats import assert_total
    from specdec_ref.exact import exact_model

    _require(backend, kind)
    scheme = exact_scheme(backend, "a lossy scheme declares no exact acceptance law")
    target = proposer_target(kind)
    spec = proposer_spec(kind, sample)
    law, table = law_of(spec, PROPOSER_TARGET), exact_model(PROPOSER_TARGET)
    need = math.ceil(_accept_rounds(ctx, ACCEPT_SHIFT) * ctx.sample_scale)
    seed = ctx.seed_for("proposer-accept", f"{kind}-{sample}")
    prompt_gen = np.random.default_rng(seed)
    prompts = [[int(x) for x in prompt_gen.integers(0, table.vocab - 1, size=int(prompt_gen.integers(2, 5)))]
               for _ in range(4096)]

    def draw(_, index, size):
        rows = range(index * size, (index + 1) * size)
        reqs = [Request(prompt=prompts[i % len(prompts)], max_new_tokens=ACCEPT_NEW_TOKENS, sampling=PROPOSER_SAMPLING,
                        seed=seed + i) for i in rows]
        results = _decode_rows(backend, target, spec, reqs, PROPOSER_K, f"{kind}, rows {rows[0]}..")
        return [(list(r.prompt), r.seed, res) for r, res in zip(reqs, results)]

    memo = _ROUND_LAWS.setdefault((law, scheme), {})  # per distinct round start, shared by the looks
    rules = _ROUND_RULES.setdefault(law, {})
    claims = reports_drafts(backend) and law.one_hot
    observed, means, variances, kinds = {}, {}, {}, {}
    rounds, decoded = 0, 0
    while rounds < need:
        batch = streams.draws(ctx.streams, ("proposer-accept", kind, sample, seed), decoded + ROW_CHUNK, start=lambda: None,
                              draw=draw, chunk=ROW_CHUNK)[decoded:]
        decoded += len(batch)
        for prompt, row_seed, res in batch:
            full = prompt + list(res.tokens)
            previous = None
            for r in res.rounds:
                where = _round_kind(previous).split(" (")[0]
                previous = r
                text = full[: r.start]
                key = round_key(law, text, PROPOSER_K)
                rule = rules.get(key)
                if rule is None:
                    rule = rules[key] = _rule(law, text)
                if r.proposed != rule[0] or (claims and rule[1] is not None and r.drafts != rule[1]):  # else it follows
                    _assert_round_follows_rule(r, rule, text, claims, r is res.rounds[-1], ctx,
                                               f"{kind} proposer ({'sampled' if sample else 'argmax'} drafts), "
                                               f"{PROPOSER_SAMPLING.label()}, k={PROPOSER_K}, prompt {prompt}, seed "
                                               f"{row_seed}")
                if r.proposed == 0:
                    continue
                if key not in memo:
                    memo[key] = round_acceptance(table, law, text, [], PROPOSER_SAMPLING, PROPOSER_K, scheme)
                dist = memo[key]
                tail = np.cumsum(dist[::-1])[::-1]  # P(m >= i)
                for i in range(1, len(dist)):
                    for bucket in ("all", where):
                        observed[bucket, i] = observed.get((bucket, i), 0) + (r.accepted >= i)
                        means.setdefault((bucket, i), []).append(tail[i])
                        variances.setdefault((bucket, i), []).append(tail[i] * (1 - tail[i]))
                kinds[where] = kinds.get(where, 0) + 1
                rounds += 1
    breakdown = "; ".join(
        f"{bucket}: " + ", ".join(f"pos {i} {observed[bucket, i]} vs {sum(means[bucket, i]):.1f}"
                                  for i in range(1, PROPOSER_K + 1) if (bucket, i) in observed)
        for bucket in sorted({b for b, _ in observed if b != "all"}))
    for i in range(1, PROPOSER_K + 1):
        if ("all", i) not in observed:
            continue
        ctx.record(assert_total(
            observed["all", i], means["all", i], variances["all", i], unit="rounds", shift=ACCEPT_SHIFT,
            what=f"{kind} proposer ({'sampled' if sample else 'argmax'} drafts), {PROPOSER_SAMPLING.label()}, "
            f"k={PROPOSER_K} on {PROPOSER_PAIR}: rounds accepting at least {i} drafts vs the exact expectation of the "
            f"declared scheme ({scheme.label}) given each round's text [{rounds} rounds: {breakdown}]",
        ))


#: The heads whose decoder layers keep a KV cache of their own (prompt lookup and Medusa have none).
CACHED_HEADS = ("eagle", "eagle3", "mtp")


@check(
    guards="a drafter head's own KV cache not following the committed text: entries of the draft steps (computed from "
    "the head's own features) kept after the round, the catch-up written after them or at the wrong positions, "
    "entries from a rejected draft's feature, a position-0 mask applied elsewhere (invisible to the law and, on heads "
    "whose layer adds nothing, to acceptance)",
    requires=("decoder", "cache"),
    cases=[(kind, {"kind": kind}) for kind in CACHED_HEADS],
)
def check_proposer_head_cache_matches_fresh_catchup(backend, ctx: CheckContext, kind: str):
    """After every round of greedy decoding with the exactly-known head, the K/V its decoder layers hold (the
    ``draft_cache`` view ``on_round`` gets) equal a fresh read of the committed pairs ``(c_p+1, f_p)`` with the
    target's features (``specdec_properties.stateful_cache.fresh_head_kv``), for every position the head holds; it holds at
    least the pairs up to the round's pending token and none past the committed text."""
    from specdec_properties.stateful_cache import CacheMismatch, compare_kv, fresh_head_kv

    _require(backend, kind)
    target = proposer_target(kind)
    spec = proposer_spec(kind, False)
    for prompt in GREEDY_PROMPTS[:5]:
        full = list(prompt) + _table_greedy(prompt, GREEDY_NEW_TOKENS)  # greedy: the committed text is the table's
        for k in (1, 3):
            rounds = []

            def hook(record, target_cache, draft_cache):  # checked as the round ends: before a stale cache overflows
                i = len(rounds)
                rounds.append(record)
                start, committed, kv = record.start, record.committed_len, draft_cache.layer_kv()
                where = f"{kind} head, greedy, k={k}, prompt {list(prompt)}, after round {i} (committed {committed} tokens)"
                held = kv[0][0].shape[2] if kv else 0
                assert max(start - 1, 0) <= held <= committed - 1, (
                    f"{where}: the head's cache holds {held} positions; it must hold the pairs up to the round's pending "
                    f"token ({max(start - 1, 0)}) and none past the committed text ({committed - 1})\n  replay: {ctx.replay}")
                try:
                    compare_kv(kv, fresh_head_kv(spec, target, full[:committed], held), context=f" ({where})")
                except CacheMismatch as exc:
                    raise AssertionError(f"{exc}: the head's entries are not a fresh read of the committed pairs with the "
                                         f"target's features\n  replay: {ctx.replay}") from None

            result = _decode(backend, target, spec, torch.tensor([prompt]), k=k, max_new_tokens=GREEDY_NEW_TOKENS,
                             sampling=GREEDY, on_round=hook)
            assert list(prompt) + list(result.tokens) == full, (
                f"{kind} head, greedy, k={k}, prompt {list(prompt)}: the output is not the target's greedy continuation "
                f"{full[len(prompt):]}: {result.tokens}\n  replay: {ctx.replay}")
            assert rounds, f"{kind} head, k={k}, prompt {list(prompt)}: on_round was never called (the contract asks it " \
                f"of a backend claiming cache)"
