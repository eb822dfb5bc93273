"""Conformance checks of the block verifier (``backend.verify``): the declared scheme's exact laws.

Per block (first token, token and residual at each position, bonus, accepted length, batch invariance,
generated distributions) and over rounds (the decoded text's law). The checks of the outputs themselves
(structure, greedy paths, edge cases, seeds, per-row generators) are in :mod:`conformance.verifier_output_checks`,
which uses the scenario helpers here; both run in ``conformance/test_verifier.py``, these first.

Statistical checks share one large sample per scenario (memoised per process;
pytest-xdist's ``loadgroup`` keeps a scenario's checks on one worker). Sample
sizes are computed, not chosen (:mod:`specdec_properties.sample_size`): the smallest N
that gives every check on the scenario :data:`specdec_properties.stats.TARGET_POWER`
against TV :data:`specdec_properties.stats.TV` at :data:`specdec_properties.stats.ALPHA`.
Every check calls ``verify`` through :func:`specdec_properties.sampling.verify_rows`,
so a backend that does not claim ``batched`` gets one B = 1 call per row.

Inputs are drawn on the CPU and handed to ``verify`` on ``ctx.device`` (``--specdec-device``) with
generators made there (:func:`specdec_properties.sampling.on_device` inside ``verify_rows``,
:func:`specdec_properties.sampling.device_generator`); outputs come back to the CPU before any statistic.
"""
from __future__ import annotations

import functools
import zlib

import numpy as np
from hypothesis import Phase, given, note, settings

from specdec_properties import exact
from specdec_properties.markov import empty_simulation, markov_pair, markov_sampler, sequence_labels, sequence_law, tokens_per_round
from specdec_properties.sample_size import (
    GENERATED_BLOCKS,
    GENERATED_TV,
    LOSSLESS_TV,
    NON_BATCHED_GENERATED_BLOCKS,
    NON_BATCHED_SEQUENCES,
    required_blocks,
    required_samples,
    samples_needed,
    scaled_blocks,
    with_margin,
)
from specdec_properties.sampling import CHUNK, BlockCounts, BlockSampler, emits_bonus, is_batched, sum_counts
from specdec_properties.scenarios import STAT_SCENARIOS, Scenario, balanced_scenario, for_scheme
from specdec_properties.stats import ALPHA, assert_fits, estimate_tv
from specdec_properties.strategies import distribution_pairs

from . import streams
from .registry import CheckContext, NotApplicable, check, exact_scheme

BATCH_FILLER = balanced_scenario(seed=7)


#: Each scenario's sample, per backend: a stream of chunks that grows with the looks of the cases sharing it
#: (``conformance.streams``); every look takes whole chunks of :data:`specdec_properties.sampling.CHUNK` blocks, or of
#: :data:`NON_BATCHED_CHUNK` for a backend called one block at a time.
_SAMPLES: dict[tuple, tuple[object, dict]] = {}
NON_BATCHED_CHUNK = 1024
#: Blocks per chunk of ``sampling_exact_on_generated_distributions``'s sample of each example (divisors of its
#: ``GENERATED_BLOCKS`` and of the non-batched cap, 2 000).
GENERATED_CHUNK, NON_BATCHED_GENERATED_CHUNK = 7_500, 500
#: Sequences per chunk of ``sampling_sequence_law_over_rounds`` for a backend called one row at a time (a divisor of
#: its cap, ``NON_BATCHED_SEQUENCES``, so the capped full look draws exactly the cap).
NON_BATCHED_SEQUENCE_CHUNK = 1000


def declared_scheme(backend) -> exact.SchemeSpec:
    """The backend's declared exact scheme; NotApplicable for ``lossy`` (it has no exact per-block law)."""
    return exact_scheme(
        backend,
        "the backend declares a lossy scheme: there is no exact per-block law to test; "
        "sampling_sequence_law_over_rounds measures its distance from the target's law instead",
    )


@functools.lru_cache(maxsize=None)
def scheme_scenario(name: str, scheme: exact.SchemeSpec) -> tuple[Scenario, exact.BlockLaw]:
    """Scenario ``name`` as used for ``scheme`` (:func:`specdec_properties.scenarios.for_scheme`) and its exact laws."""
    sc = for_scheme(STAT_SCENARIOS[name], scheme.name)
    return sc, exact.block_law(scheme, sc.target, sc.draft)


def scenario_counts(
    backend, ctx: CheckContext, name: str, *, batch_filler: bool = False, blocks: int | None = None
) -> BlockCounts:
    """The shared sample of scenario ``name`` for this backend (computed once per process)."""
    scenario, law = scheme_scenario(name, declared_scheme(backend))
    batched = is_batched(backend)
    n = scaled_blocks(blocks or required_blocks(scenario, law), batched=batched, scale=ctx.sample_scale)
    seed = ctx.seed_for("scenario", name, batch_filler)
    key = (id(backend), name, seed, batch_filler, ctx.device)
    if key not in _SAMPLES:
        _SAMPLES[key] = (backend, {})  # keep the backend alive so its id is not reused
    parts, _ = streams.chunks(
        _SAMPLES[key][1], "blocks", n, chunk=CHUNK if batched else NON_BATCHED_CHUNK, draw=lambda sampler, i, size: sampler.draw(size),
        start=lambda: BlockSampler(backend, scenario, seed, filler=BATCH_FILLER if batch_filler else None, device=ctx.device),
    )
    return sum_counts(parts)


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
# Every per-block law below is the *declared scheme's* exact law (specdec_properties.exact.block_law):
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
        parts, _ = streams.chunks(  # every look of the case grows the same sample of this example
            ctx.streams, ("generated", seed), blocks, draw=lambda sampler, i, size: sampler.draw(size),
            chunk=GENERATED_CHUNK if is_batched(backend) else NON_BATCHED_GENERATED_CHUNK,
            start=lambda: BlockSampler(backend, sc, seed, device=ctx.device),
        )
        counts = sum_counts(parts)
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
    the first 3 tokens is exact (specdec_properties.markov); 2 drafts per round, token-wise acceptance 0.7,
    so about half the sequences span two rounds or more. Exact for every lossless scheme, not only
    token-wise rejection sampling. Sized for power 0.99 against TV 0.005 on the 512 cells.

    For a backend declaring ``lossy`` the same sample *measures* the total variation between its
    text law and the target's, with a 99% confidence interval (specdec_properties.stats.estimate_tv), and the
    tokens it emits per verify call against token-wise verification from the same states.
    """
    pair, length = LOSSLESS_PAIR, LOSSLESS_LENGTH
    law = sequence_law(pair, length)
    cap = NON_BATCHED_SEQUENCES
    n = scaled_blocks(with_margin(required_samples(law, LOSSLESS_TV)), batched=is_batched(backend), scale=ctx.sample_scale, cap=cap)
    seed = ctx.seed_for("sequence-law-over-rounds")
    # specdec_properties.markov.simulate takes no device yet: this check's verify() calls get CPU tensors on every --specdec-device
    parts, _ = streams.chunks(  # every look of the case takes whole chunks of one simulation (conformance.streams)
        ctx.streams, ("sequence-law-over-rounds", seed), n, chunk=CHUNK if is_batched(backend) else NON_BATCHED_SEQUENCE_CHUNK,
        start=lambda: markov_sampler(backend, pair, length=length, k=LOSSLESS_K, seed=seed), draw=lambda s, i, size: s(size),
    )
    run = sum(parts, empty_simulation(pair, length))
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
