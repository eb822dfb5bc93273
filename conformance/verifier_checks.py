"""Conformance checks of the block verifier (``backend.verify``).

Statistical checks share one large sample per scenario (memoised per process;
pytest-xdist's ``loadgroup`` keeps a scenario's checks on one worker). Sample
sizes are computed, not chosen (:mod:`properties.sample_size`): the smallest N
that gives every check on the scenario :data:`properties.stats.TARGET_POWER`
against TV :data:`properties.stats.TV` at :data:`properties.stats.ALPHA`.
Every check calls ``verify`` through :func:`properties.sampling.verify_rows`,
so a backend that does not claim ``batched`` gets one B = 1 call per row.

Inputs are drawn on the CPU and handed to ``verify`` on ``ctx.device`` (``--specdec-device``) with
generators made there (:func:`properties.sampling.on_device` inside ``verify_rows``,
:func:`properties.sampling.device_generator`); outputs come back to the CPU before any statistic.
"""
from __future__ import annotations

import functools
import zlib

import numpy as np
import torch
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st

from properties import exact
from properties.markov import markov_pair, sequence_labels, sequence_law, simulate, tokens_per_round
from properties.sample_size import (
    GENERATED_BLOCKS,
    GENERATED_TV,
    LOSSLESS_TV,
    MIXED_BATCH_TV,
    NON_BATCHED_GENERATED_BLOCKS,
    NON_BATCHED_SEQUENCES,
    required_blocks,
    required_samples,
    samples_needed,
    scaled_blocks,
    with_margin,
)
from properties.sampling import BlockCounts, count_blocks, device_generator, draw_drafts, emits_bonus, is_batched, verify_rows
from properties.scenarios import STAT_SCENARIOS, Scenario, balanced_scenario, for_scheme
from properties.stats import ALPHA, assert_fits, estimate_tv
from properties.strategies import (
    Block,
    distribution_pairs,
    draft_rows_for,
    greedy_blocks,
    greedy_maximisers,
    probability_rows,
    sampling_blocks,
    seeds,
)

from .registry import CheckContext, NotApplicable, check, exact_scheme

BATCH_FILLER = balanced_scenario(seed=7)


_SAMPLES: dict[tuple, tuple[object, BlockCounts]] = {}


def declared_scheme(backend) -> exact.SchemeSpec:
    """The backend's declared exact scheme; NotApplicable for ``lossy`` (it has no exact per-block law)."""
    return exact_scheme(
        backend,
        "the backend declares a lossy scheme: there is no exact per-block law to test; "
        "sampling_sequence_law_over_rounds measures its distance from the target's law instead",
    )


@functools.lru_cache(maxsize=None)
def scheme_scenario(name: str, scheme: exact.SchemeSpec) -> tuple[Scenario, exact.BlockLaw]:
    """Scenario ``name`` as used for ``scheme`` (:func:`properties.scenarios.for_scheme`) and its exact laws."""
    sc = for_scheme(STAT_SCENARIOS[name], scheme.name)
    return sc, exact.block_law(scheme, sc.target, sc.draft)


def scenario_counts(
    backend, ctx: CheckContext, name: str, *, batch_filler: bool = False, blocks: int | None = None
) -> BlockCounts:
    """The shared sample of scenario ``name`` for this backend (computed once per process)."""
    scenario, law = scheme_scenario(name, declared_scheme(backend))
    n = scaled_blocks(blocks or required_blocks(scenario, law), batched=is_batched(backend), scale=ctx.sample_scale)
    seed = ctx.seed_for("scenario", name, batch_filler)
    key = (id(backend), name, n, seed, batch_filler, ctx.device)
    if key not in _SAMPLES:
        counts = count_blocks(backend, scenario, n, seed, filler=BATCH_FILLER if batch_filler else None, device=ctx.device)
        _SAMPLES[key] = (backend, counts)  # keep the backend alive so its id is not reused
    return _SAMPLES[key][1]


def _fit(ctx: CheckContext, counts: BlockCounts, observed, expected, what: str, labels=None, *, scenario: Scenario, scheme, **kw):
    __tracebackhide__ = True
    result = assert_fits(
        observed,
        expected,
        what=f"{what} [scheme {scheme.label}; scenario {scenario.describe()}]",
        labels=labels,
        seed=counts.seed,
        replay=ctx.replay,
        **kw,
    )
    ctx.record(result)
    return result


def _group(params: dict) -> str:
    return f"verifier-sample-{params['scenario']}"


def _position_cases(include_bonus: bool):
    """One case per scenario and position (ids ``<scenario>-j<position>``); a position the
    scenario cannot test is skipped by the check with its reason, never dropped from the list."""
    for name, sc in STAT_SCENARIOS.items():
        for j in range(sc.k + 1 if include_bonus else sc.k):
            yield f"{name}-j{j}", {"scenario": name, "j": j}


def _require_position(sc: Scenario, law: exact.BlockLaw, j: int, *, stop: bool = False) -> None:
    """NotApplicable when the scenario never reaches position ``j`` (or, with ``stop``, never stops there)."""
    if law.reach[j] == 0:
        raise NotApplicable(f"scenario {sc.name!r} never reaches position {j} (a draft before it is always rejected)")
    if stop and law.length[j] == 0:
        raise NotApplicable(f"scenario {sc.name!r} never stops at position {j} (its draft there is always accepted)")


def _token_labels(vocab: int) -> list[str]:
    return [f"token {x}" for x in range(vocab)]


def _step_labels(vocab: int) -> list[str]:
    """Cells of BlockCounts.steps[j]: stopped there and emitted x, then accepted draft x."""
    return [f"reject->{x}" for x in range(vocab)] + [f"accept {x}" for x in range(vocab)]


def _length_labels(k: int) -> list[str]:
    return [f"m={j}" for j in range(k + 1)]


# ----------------------------------------------------------------------------- statistical
#
# Every per-block law below is the *declared scheme's* exact law (properties.exact.block_law):
# token-wise in closed form, one-hot draft and block verification by enumerating the drafts. A
# backend that runs another scheme than it declares fails them.


@check(
    guards="replacement drawn from p instead of the residual, residual [q-p]_+, inverted ratio: any bias in the first emitted token",
    requires=("verifier", "sampling"),
    cases=[(name, {"scenario": name}) for name in STAT_SCENARIOS],
    group=_group,
    statistical=True,
)
def check_sampling_first_token_follows_row0(backend, ctx: CheckContext, scenario: str):
    """The first emitted token (accepted d_1 or its replacement) is distributed as target row 0 (every exact scheme)."""
    spec = declared_scheme(backend)
    sc, law = scheme_scenario(scenario, spec)
    counts = scenario_counts(backend, ctx, scenario)
    _fit(ctx, counts, counts.emitted(0), law.emitted(0), "first emitted token vs row 0", _token_labels(sc.vocab), scenario=sc, scheme=spec)


@check(
    guards="logits off by one (d_i judged with the next row), rows mixed up between positions",
    requires=("verifier", "sampling"),
    cases=list(_position_cases(include_bonus=True)),
    group=_group,
    statistical=True,
)
def check_sampling_token_at_j_follows_row_j(backend, ctx: CheckContext, scenario: str, j: int):
    """Given m >= j, the token at position j has the scheme's exact law (row j itself for token-wise and one-hot draft)."""
    spec = declared_scheme(backend)
    sc, law = scheme_scenario(scenario, spec)
    if j == sc.k and not spec.bonus:
        raise NotApplicable("the backend declares bonus=False: nothing is emitted at position k")
    _require_position(sc, law, j)
    counts = scenario_counts(backend, ctx, scenario)
    _fit(
        ctx,
        counts,
        counts.emitted(j),
        law.emitted(j),
        f"token emitted at position {j} given the first {j} drafts accepted",
        _token_labels(sc.vocab),
        scenario=sc,
        scheme=spec,
    )


@check(
    guards="resampling from p after a rejection, residual [q-p]_+, residual not clamped or not renormalised, another scheme's residual",
    requires=("verifier", "sampling"),
    cases=list(_position_cases(include_bonus=False)),
    group=_group,
    statistical=True,
)
def check_sampling_residual_at_j(backend, ctx: CheckContext, scenario: str, j: int):
    """Given the block stopped at j < k, the replacement follows the scheme's residual (token-wise: [p_j - q_j]_+)."""
    spec = declared_scheme(backend)
    sc, law = scheme_scenario(scenario, spec)
    _require_position(sc, law, j, stop=True)
    counts = scenario_counts(backend, ctx, scenario)
    _fit(
        ctx,
        counts,
        counts.residual(j),
        law.residual(j),
        f"replacement after a stop at position {j}",
        _token_labels(sc.vocab),
        scenario=sc,
        scheme=spec,
    )


@check(
    guards="inverted acceptance ratio, q not the distribution the draft sampled from, deterministic acceptance",
    requires=("verifier", "sampling"),
    cases=list(_position_cases(include_bonus=False)),
    group=_group,
    statistical=True,
)
def check_sampling_accept_and_token_at_j(backend, ctx: CheckContext, scenario: str, j: int):
    """At a reached position j, (stopped?, token) has the scheme's joint law (token-wise: [p_j - q_j]_+, min(p_j, q_j))."""
    spec = declared_scheme(backend)
    sc, law = scheme_scenario(scenario, spec)
    _require_position(sc, law, j)
    counts = scenario_counts(backend, ctx, scenario)
    _fit(ctx, counts, counts.steps[j], law.steps[j], f"(stopped?, token) at position {j}", _step_labels(sc.vocab), scenario=sc, scheme=spec)


@check(
    guards="bonus token missing, drawn from the wrong row (row k-1) or from the residual",
    requires=("verifier", "sampling"),
    cases=[(name, {"scenario": name}) for name in STAT_SCENARIOS],
    group=_group,
    statistical=True,
)
def check_sampling_bonus_follows_row_k(backend, ctx: CheckContext, scenario: str):
    """Given all k drafts accepted, the bonus token follows the scheme's bonus law (row k)."""
    spec = declared_scheme(backend)
    if not spec.bonus:
        raise NotApplicable("the backend declares bonus=False (structure checks verify that no bonus is emitted)")
    sc, law = scheme_scenario(scenario, spec)
    counts = scenario_counts(backend, ctx, scenario)
    _fit(ctx, counts, counts.bonus, law.emitted(sc.k), f"bonus token vs row {sc.k}", _token_labels(sc.vocab), scenario=sc, scheme=spec)


@check(
    guards="accepting later drafts after a rejection, inverted or deterministic acceptance, another scheme than declared "
    "(e.g. token-wise acceptance declared as block verification: lossless but less efficient than claimed)",
    requires=("verifier", "sampling"),
    cases=[(name, {"scenario": name}) for name in STAT_SCENARIOS],
    group=_group,
    statistical=True,
)
def check_sampling_accepted_length_law(backend, ctx: CheckContext, scenario: str):
    """The accepted length m has the declared scheme's exact law, so its mean is the scheme's own efficiency."""
    spec = declared_scheme(backend)
    sc, law = scheme_scenario(scenario, spec)
    counts = scenario_counts(backend, ctx, scenario)
    what = f"accepted length m vs its exact law (mean {law.mean_accepted():.4f}, observed {np.dot(np.arange(sc.k + 1), counts.length) / max(counts.n, 1):.4f})"
    _fit(ctx, counts, counts.length, law.length, what, _length_labels(sc.k), scenario=sc, scheme=spec)


@check(
    guards="a row's result depending on other rows of the batch (broadcasting row 0, batch-wide normalisation)",
    requires=("verifier", "sampling", "batched"),
    cases=[("balanced", {"scenario": "balanced"})],
    statistical=True,
)
def check_sampling_batch_invariance(backend, ctx: CheckContext, scenario: str):
    """Rows of the scenario interleaved with other rows in one batch keep the scenario's exact laws."""
    spec = declared_scheme(backend)
    sc, law = scheme_scenario(scenario, spec)
    needed = max(samples_needed(law.length, 1.0), samples_needed(law.emitted(0), 1.0))
    counts = scenario_counts(backend, ctx, scenario, batch_filler=True, blocks=with_margin(needed))
    what = "in a batch interleaved with other rows: "
    _fit(ctx, counts, counts.length, law.length, what + "accepted length m", _length_labels(sc.k), scenario=sc, scheme=spec)
    _fit(ctx, counts, counts.emitted(0), law.emitted(0), what + "first emitted token", _token_labels(sc.vocab), scenario=sc, scheme=spec)


@check(
    guards="numerical guards: zeros in p or q, tiny masses, p == q rows, one-hot and tied rows",
    requires=("verifier", "sampling"),
    statistical=True,
)
def check_sampling_exact_on_generated_distributions(backend, ctx: CheckContext):
    """For Hypothesis-generated p/q of every shape, the length law and position-0 laws are the scheme's exact ones.

    Each example verifies GENERATED_BLOCKS blocks and runs three tests at
    alpha = ALPHA / (3 * max_examples), stated with their power against TV 0.03.
    """
    spec = declared_scheme(backend)
    examples = settings().max_examples
    alpha = ALPHA / (3 * examples)

    @settings(phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(pair=distribution_pairs())
    def generated(pair):
        target, draft, relation = pair
        sc = Scenario(name="generated", target=target, draft=draft, purpose=relation)
        seed = ctx.seed_for("generated", zlib.crc32(target.tobytes() + draft.tobytes()))
        note(f"scenario: {sc.describe()}, draft relation {relation}, scheme {spec.label}, seed {seed}")
        note(f"target rows: {target.tolist()}")
        note(f"draft rows: {draft.tolist()}")
        law = exact.block_law(spec, target, draft)
        blocks = scaled_blocks(GENERATED_BLOCKS, batched=is_batched(backend), scale=ctx.sample_scale, cap=NON_BATCHED_GENERATED_BLOCKS)
        counts = count_blocks(backend, sc, blocks, seed, device=ctx.device)
        kw = dict(alpha=alpha, tv=GENERATED_TV, seed=seed, replay=ctx.replay)
        ctx.record(assert_fits(counts.length, law.length, what="accepted length m", labels=_length_labels(sc.k), **kw))
        ctx.record(assert_fits(counts.emitted(0), law.emitted(0), what="first emitted token", labels=_token_labels(sc.vocab), **kw))
        ctx.record(assert_fits(counts.steps[0], law.steps[0], what="(stopped?, token) at position 0", labels=_step_labels(sc.vocab), **kw))

    generated()


#: The tables, length and draft count of the multi-round sequence-law check.
LOSSLESS_PAIR = markov_pair()
LOSSLESS_LENGTH = 3
LOSSLESS_K = 2


@check(
    guards="any loss of exactness over rounds, whatever the verification scheme: a biased residual or acceptance, "
    "rows misaligned, a token lost, duplicated or reordered between rounds, a lossy scheme declared lossless",
    requires=("verifier", "sampling"),
    statistical=True,
)
def check_sampling_sequence_law_over_rounds(backend, ctx: CheckContext):
    """Text decoded round after round through verify() follows the target's autoregressive law.

    Target and draft are Markov tables (next-token law depends on the last token), so the law of
    the first 3 tokens is exact (properties.markov); 2 drafts per round, token-wise acceptance 0.7,
    so about half the sequences span two rounds or more. Exact for every lossless scheme, not only
    token-wise rejection sampling. Sized for power 0.99 against TV 0.005 on the 512 cells.

    For a backend declaring ``lossy`` the same sample *measures* the total variation between its
    text law and the target's, with a 99% confidence interval (properties.stats.estimate_tv), and the
    tokens it emits per verify call against token-wise verification from the same states.
    """
    pair, length = LOSSLESS_PAIR, LOSSLESS_LENGTH
    law = sequence_law(pair, length)
    cap = NON_BATCHED_SEQUENCES
    n = scaled_blocks(with_margin(required_samples(law, LOSSLESS_TV)), batched=is_batched(backend), scale=ctx.sample_scale, cap=cap)
    seed = ctx.seed_for("sequence-law-over-rounds")
    # properties.markov.simulate takes no device yet: this check's verify() calls get CPU tensors on every --specdec-device
    run = simulate(backend, pair, n, length=length, k=LOSSLESS_K, seed=seed)
    what = f"first {length} tokens decoded over rounds (k={LOSSLESS_K}) vs the target's law [{pair.describe()}]"
    if getattr(getattr(backend, "capabilities", None), "scheme", "token") == "lossy":
        token_wise = exact.SchemeSpec("token", bonus=emits_bonus(backend))
        baseline = float(run.rounds @ tokens_per_round(pair, token_wise, LOSSLESS_K)) / max(int(run.rounds.sum()), 1)
        extra = {
            "tokens_per_round": run.tokens_per_round,
            "token_wise_tokens_per_round": baseline,
            "gain": run.tokens_per_round / baseline,
        }
        ctx.record(estimate_tv(run.counts, law, what=what, extra=extra))
        return
    ctx.record(
        assert_fits(
            run.counts, law, what=what, labels=sequence_labels(pair.vocab, length), tv=LOSSLESS_TV, seed=seed, replay=ctx.replay,
        )
    )


# ----------------------------------------------------------------------------- deterministic


def _call(backend, block: Block, generator=None, where: str = "", *, device=None):
    """``verify`` on the block (one B = 1 call per row for a non-batched backend) with its tensors on ``device``
    (the generator must live there), output structure-checked and back on the CPU."""
    __tracebackhide__ = True
    return verify_rows(
        backend, block.draft_tokens, block.draft_probs, block.target_probs,
        generator=generator, where=where or block.describe(), vocab=block.vocab, device=device,
    )


@check(
    guards="non-contiguous acceptance, missing bonus/replacement, wrong padding, ids out of range, wrong shapes or dtypes",
    requires=("verifier", "sampling"),
)
def check_structure_sampling(backend, ctx: CheckContext):
    """Sampling output: 0 <= m <= k, tokens[:m] are the drafts, tokens[m] in [0, V), -1 after."""

    @given(block=sampling_blocks(), seed=seeds)
    def structure(block, seed):
        note(block.describe())
        _call(backend, block, device_generator(seed, ctx.device), device=ctx.device)

    structure()


@check(
    guards="non-contiguous acceptance, missing bonus/replacement, wrong padding, ids out of range, wrong shapes or dtypes",
    requires=("verifier", "greedy"),
)
def check_structure_greedy(backend, ctx: CheckContext):
    """Greedy output: 0 <= m <= k, tokens[:m] are the drafts, tokens[m] in [0, V), -1 after."""

    @given(block=greedy_blocks())
    def structure(block):
        note(block.describe())
        _call(backend, block, device=ctx.device)

    structure()


@check(
    guards="greedy compared against the wrong row, acceptance past a mismatch, wrong replacement or bonus",
    requires=("verifier", "greedy"),
)
def check_greedy_valid_path(backend, ctx: CheckContext):
    """Greedy output is a valid greedy path for Hypothesis blocks with forced stops and exact ties.

    Every accepted draft and the emitted token are maximisers of their rows, and
    a stop before k emits a token different from the rejected draft. With no
    ties this is exactly ``argmax`` decoding.
    """

    @given(block=greedy_blocks())
    def valid_path(block):
        note(block.describe())
        m, tokens = _call(backend, block, device=ctx.device)
        rows = block.target_probs.numpy()
        drafts = block.draft_tokens.numpy()
        for b in range(drafts.shape[0]):
            mb = int(m[b])
            for i in range(mb):
                best = greedy_maximisers(rows[b, i])
                assert drafts[b, i] in best, (
                    f"row {b}: draft d_{i + 1} = {drafts[b, i]} was accepted but the maximisers of target row {i} "
                    f"are {best.tolist()} (p[d] = {rows[b, i, drafts[b, i]]:.6g}, max = {rows[b, i].max():.6g})"
                )
            if mb == block.k and not emits_bonus(backend):
                continue  # no-bonus variant: nothing emitted after k accepted drafts (structure-checked)
            best = greedy_maximisers(rows[b, mb])
            emitted = int(tokens[b, mb])
            what = "bonus" if mb == block.k else "replacement"
            assert emitted in best, (
                f"row {b}: the {what} at position {mb} is {emitted} but the maximisers of target row {mb} are "
                f"{best.tolist()}; pattern {block.pattern}"
            )
            if mb < block.k:
                assert emitted != drafts[b, mb], (
                    f"row {b}: stopped at m={mb} although draft d_{mb + 1} = {drafts[b, mb]} is the emitted greedy "
                    f"choice of row {mb}: a matching draft must be accepted"
                )

    valid_path()


@check(guards="rejections when p == q (acceptance must be 1), e.g. u <= p/q with u in (0, 1] or a ratio computed in low precision", requires=("verifier", "sampling"))
def check_sampling_p_equals_q_accepts_all(backend, ctx: CheckContext):
    """With draft rows equal to the target rows every drafted token is accepted and the bonus comes from row k
    (schemes ``token`` and ``block``; a one-hot-draft or lossy scheme rejects some drafts by design)."""
    scheme = getattr(getattr(backend, "capabilities", None), "scheme", "token")
    if scheme not in ("token", "block"):
        raise NotApplicable(f"scheme {scheme!r} does not accept every draft when p == q")
    bonus_emitted = emits_bonus(backend)

    @given(vocab=st.integers(2, 48), k=st.integers(1, 8), data=st.data(), seed=seeds)
    def accepts_all(vocab, k, data, seed):
        target = data.draw(probability_rows(vocab, k + 1), label="target rows")
        batch = 256
        gen = torch.Generator().manual_seed(seed)
        q = torch.tensor(target[:k], dtype=torch.float32)
        block = Block(
            draft_tokens=draw_drafts(q, batch, gen),
            draft_probs=q.expand(batch, -1, -1),
            target_probs=torch.tensor(target, dtype=torch.float32).expand(batch, -1, -1),
            pattern="p == q",
        )
        m, tokens = _call(backend, block, device_generator(seed, ctx.device, cpu=gen), device=ctx.device)
        rejected = (m < k).nonzero()
        assert len(rejected) == 0, (
            f"p == q but row {int(rejected[0])} stopped at m={int(m[rejected[0]])} < k={k} "
            f"(drafts {block.draft_tokens[rejected[0]].tolist()})"
        )
        if bonus_emitted:
            bonus = tokens[:, k]
            assert (torch.tensor(target[k])[bonus] > 0).all(), "a bonus token has zero probability under row k"

    accepts_all()


@check(guards="acceptance or replacement ignoring the target (e.g. replacement from q, argmax of the wrong row)", requires=("verifier", "sampling"))
def check_sampling_one_hot_target_is_deterministic(backend, ctx: CheckContext):
    """With one-hot target rows the output is fully determined: accept d_i iff it is the hot token, then emit the hot token."""

    @given(block=sampling_blocks(), seed=seeds)
    def deterministic(block, seed):
        hot = block.target_probs.argmax(-1)
        one_hot = torch.nn.functional.one_hot(hot, block.vocab).float()
        block = Block(block.draft_tokens, block.draft_probs, one_hot, block.pattern + " (one-hot target)")
        note(block.describe())
        m, tokens = _call(backend, block, device_generator(seed, ctx.device), device=ctx.device)
        expected_m = (block.draft_tokens == hot[:, : block.k]).long().cumprod(1).sum(1)
        bonus_emitted = emits_bonus(backend)
        for b in range(len(m)):
            assert int(m[b]) == int(expected_m[b]), (
                f"row {b}: one-hot target {hot[b].tolist()}, drafts {block.draft_tokens[b].tolist()}: "
                f"expected m={int(expected_m[b])}, got m={int(m[b])}"
            )
            if int(m[b]) == block.k and not bonus_emitted:
                continue
            assert int(tokens[b, m[b]]) == int(hot[b, m[b]]), (
                f"row {b}: after m={int(m[b])} the emitted token must be the hot token {int(hot[b, m[b]])}, got {int(tokens[b, m[b]])}"
            )

    deterministic()


@check(guards="accepting a drafted token the target gives probability 0 (division guards, p/q with q=0)", requires=("verifier", "sampling"))
def check_sampling_zero_target_prob_rejected(backend, ctx: CheckContext):
    """A drafted token with p = 0 at its row is always rejected, so m never passes it."""

    @given(data=st.data(), vocab=st.integers(2, 48), k=st.integers(1, 8), seed=seeds)
    def rejected(data, vocab, k, seed):
        target = data.draw(probability_rows(vocab, k + 1, kinds=("sparse", "one_hot", "tiny_masses")), label="target rows")
        rng = np.random.default_rng(seed)
        q = draft_rows_for("disjoint_zeros", target[:k], rng)
        batch = 64
        gen = torch.Generator().manual_seed(seed)
        qt = torch.tensor(q, dtype=torch.float32)
        block = Block(draw_drafts(qt, batch, gen), qt.expand(batch, -1, -1), torch.tensor(target, dtype=torch.float32).expand(batch, -1, -1), "p=0 drafts")
        m, _ = _call(backend, block, device_generator(seed, ctx.device, cpu=gen), device=ctx.device)
        p_d = block.target_probs.gather(2, block.draft_tokens[..., None].long())[..., 0][:, :k]
        zero = (p_d == 0).long()
        first_zero = torch.cat([zero, torch.ones(batch, 1, dtype=torch.long)], 1).argmax(1)
        over = (m > first_zero).nonzero()
        assert len(over) == 0, (
            f"row {int(over[0])}: draft d_{int(first_zero[over[0]]) + 1} = {int(block.draft_tokens[over[0], first_zero[over[0]]])} "
            f"has target probability 0 at row {int(first_zero[over[0]])} but was accepted (m={int(m[over[0]])})"
        )

    rejected()


def _seeded_run(backend, seed: int, device, batch: int = 4096):
    sc = STAT_SCENARIOS["balanced"]
    draft = torch.tensor(sc.draft, dtype=torch.float32)
    drafts = draw_drafts(draft, batch, torch.Generator().manual_seed(12345))
    block = Block(drafts, draft.expand(batch, -1, -1), torch.tensor(sc.target, dtype=torch.float32).expand(batch, -1, -1), "seeded")
    return _call(backend, block, device_generator(seed, device), where=f"balanced scenario, generator seed {seed}", device=device)


@check(guards="seeds ignored: results that differ for the same generator seed, or do not change with it", requires=("verifier", "sampling"))
def check_sampling_seeded_reproducible(backend, ctx: CheckContext):
    """The same generator seed gives bit-identical results; another seed gives different ones."""
    seed = ctx.seed_for("seeded")
    m1, t1 = _seeded_run(backend, seed, ctx.device)
    m2, t2 = _seeded_run(backend, seed, ctx.device)
    diff = (t1 != t2).any(1).nonzero()
    assert len(diff) == 0, (
        f"generator seed {seed} gave different results in row {int(diff[0])}: {t1[diff[0]].tolist()} vs {t2[diff[0]].tolist()}"
    )
    m3, t3 = _seeded_run(backend, seed + 1, ctx.device)
    assert not torch.equal(t1, t3), f"generator seeds {seed} and {seed + 1} gave identical results on 4096 blocks: is the generator used?"


@check(guards="randomness drawn from the global RNG instead of the given generator", requires=("verifier", "sampling"))
def check_sampling_ignores_global_rng(backend, ctx: CheckContext):
    """With a generator given, the global torch RNG state does not change the result."""
    seed = ctx.seed_for("global")
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(1)
        _, t1 = _seeded_run(backend, seed, ctx.device)
        torch.manual_seed(2)
        _, t2 = _seeded_run(backend, seed, ctx.device)
    finally:
        torch.random.set_rng_state(state)
    diff = (t1 != t2).any(1).nonzero()
    assert len(diff) == 0, (
        f"same generator seed {seed}, different global seeds (1 vs 2): row {int(diff[0])} gave "
        f"{t1[diff[0]].tolist()} vs {t2[diff[0]].tolist()}"
    )


# ----------------------------------------------------------------------------- per-row generators
#
# Engines decode many requests at once, each with its own seed or none. A backend claiming
# ``row_generators`` takes one generator per row (``None``: an unseeded row, the global RNG).


def _mixed_block(rows: int, seed: int) -> Block:
    """Even rows: the batch-filler scenario (they get seeds); odd rows: the balanced scenario (unseeded)."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for sc in (BATCH_FILLER, STAT_SCENARIOS["balanced"]):
        q = torch.tensor(sc.draft, dtype=torch.float32)
        parts.append((draw_drafts(q, rows // 2, gen), q.expand(rows // 2, -1, -1), torch.tensor(sc.target, dtype=torch.float32).expand(rows // 2, -1, -1)))

    def interleave(a, b):
        return torch.stack([a, b], 1).reshape(rows, *a.shape[1:])

    return Block(*(interleave(a, b) for a, b in zip(*parts)), pattern="seeded filler rows (even) / unseeded balanced rows (odd)")


def _row_seeds(rows: int, base: int) -> list[int | None]:
    return [base + b if b % 2 == 0 else None for b in range(rows)]


def _run_with_global_seed(backend, block: Block, seeds: list[int | None], global_seed: int, where: str, device):
    """``verify`` with one generator per row (a fresh one per seed on ``device``, None for unseeded) under a given global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(global_seed)
        gens = [None if s is None else device_generator(s, device) for s in seeds]
        return _call(backend, block, gens, where=where, device=device)


@check(
    guards="per-request seeds ignored (one stream for the whole batch, TensorRT-LLM PR 17599), a seeded row's output "
    "depending on its neighbours or its position, rows regrouped by seeded/unseeded and written back in the wrong order "
    "(vLLM issue 9441), unseeded rows all given one default seed",
    requires=("verifier", "sampling", "batched", "row_generators"),
)
def check_sampling_row_generators_reproduce_alone(backend, ctx: CheckContext):
    """With one generator per row in a batch mixing seeded and unseeded rows, every seeded row's output is
    bit-identical to verifying it alone with its own generator, and in a permuted batch with other neighbours and
    another global RNG state; unseeded rows with identical inputs are not copies of each other."""
    rows = 256
    block = _mixed_block(rows, ctx.seed_for("row-generators-block"))
    seeds = _row_seeds(rows, ctx.seed_for("row-generators"))
    _, t1 = _run_with_global_seed(backend, block, seeds, 1, "mixed batch, global seed 1", ctx.device)
    for b in range(0, 32, 2):
        one = Block(block.draft_tokens[b : b + 1], block.draft_probs[b : b + 1], block.target_probs[b : b + 1], "alone")
        _, alone = _call(backend, one, [device_generator(seeds[b], ctx.device)], where=f"row {b} alone, seed {seeds[b]}", device=ctx.device)
        assert torch.equal(alone[0], t1[b]), (
            f"row {b} (generator seed {seeds[b]}) gave {t1[b].tolist()} in the mixed batch but {alone[0].tolist()} verified "
            "alone with the same generator: a seeded row's output must depend only on its inputs and its own generator"
        )
    perm = torch.arange(rows).flip(0)
    other = _mixed_block(rows, ctx.seed_for("row-generators-neighbours"))
    shuffled = Block(
        torch.where(torch.arange(rows)[:, None] % 2 == 0, block.draft_tokens, other.draft_tokens)[perm],
        block.draft_probs[perm], block.target_probs[perm], "permuted, other unseeded neighbours",
    )
    _, t2 = _run_with_global_seed(backend, shuffled, [seeds[int(b)] for b in perm], 2, "permuted batch, global seed 2", ctx.device)
    back = t2[perm.argsort()]
    for b in range(0, rows, 2):
        assert torch.equal(back[b], t1[b]), (
            f"row {b} (seed {seeds[b]}) gave {t1[b].tolist()} at position {b} but {back[b].tolist()} at position "
            f"{int(perm.argsort()[b])} of a permuted batch with other unseeded neighbours and another global RNG state"
        )
    same = Block(block.draft_tokens[1:2].expand(64, -1), block.draft_probs[1:2].expand(64, -1, -1), block.target_probs[1:2].expand(64, -1, -1), "same input")
    _, copies = _run_with_global_seed(backend, same, [None] * 64, 3, "64 unseeded rows with identical inputs", ctx.device)
    assert not (copies == copies[:1]).all(), (
        f"64 unseeded rows with identical inputs all gave {copies[0].tolist()}: unseeded rows must draw fresh randomness, "
        "not one default seed each"
    )


@check(
    guards="rows of a mixed seeded/unseeded batch swapped or regrouped (vLLM issue 9441: garbage for mixed batches), "
    "unseeded rows drawing from a biased or reused stream",
    requires=("verifier", "sampling", "batched", "row_generators"),
    statistical=True,
)
def check_sampling_mixed_batch_group_laws(backend, ctx: CheckContext):
    """In batches mixing seeded rows (one scenario) and unseeded rows (another), each group keeps its own
    scenario's exact laws: accepted length and first emitted token, power 0.99 against TV 0.02 each."""
    spec = declared_scheme(backend)
    groups = {"seeded": (BATCH_FILLER, 0), "unseeded": (STAT_SCENARIOS["balanced"], 1)}
    laws = {name: exact.block_law(spec, sc.target, sc.draft) for name, (sc, _) in groups.items()}
    tv = MIXED_BATCH_TV
    needed = max(required_samples(law.length, tv) for law in laws.values())
    needed = max([needed] + [required_samples(law.emitted(0), tv) for law in laws.values()])
    rows = 2048
    chunks = max(1, -(-scaled_blocks(with_margin(needed), batched=True, scale=ctx.sample_scale) // (rows // 2)))
    k, vocab = BATCH_FILLER.k, BATCH_FILLER.vocab
    counts = {name: (np.zeros(k + 1, dtype=np.int64), np.zeros(vocab, dtype=np.int64)) for name in groups}
    for c in range(chunks):
        block = _mixed_block(rows, ctx.seed_for("mixed-laws-block", c))
        m, tokens = _run_with_global_seed(
            backend, block, _row_seeds(rows, ctx.seed_for("mixed-laws", c)), ctx.seed_for("mixed-global", c), f"mixed batch {c}", ctx.device
        )
        for name, (_, parity) in groups.items():
            length, first = counts[name]
            length += np.bincount(m[parity::2].numpy(), minlength=k + 1)
            first += np.bincount(tokens[parity::2, 0].numpy(), minlength=vocab)
    for name, (sc, _) in groups.items():
        length, first = counts[name]
        kw = dict(tv=tv, seed=ctx.seed_for("mixed-laws"), replay=ctx.replay)
        what = f"{name} rows of mixed seeded/unseeded batches [scheme {spec.label}; scenario {sc.describe()}]: "
        ctx.record(assert_fits(length, laws[name].length, what=what + "accepted length m", labels=_length_labels(k), **kw))
        ctx.record(assert_fits(first, laws[name].emitted(0), what=what + "first emitted token", labels=_token_labels(vocab), **kw))
