"""Verification schemes: the oracle's exact laws, the reference implementations, and their certification.

The oracle (``specdec_properties.exact``) is checked against the schemes' definitions independently of the
implementations: token-wise enumeration equals the closed form, every lossless scheme's multi-round
law equals the target's, and block verification reproduces the paper's example and never accepts
fewer drafts than token-wise verification. The implementations (``specdec_ref.schemes``) are then
certified by the conformance checks against that oracle, and the lossy one is measured.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.registry import CheckContext, all_cases, load_check_modules, run_case, run_checks
from conformance.report import LOSSY, certificate_for_records
from specdec_properties import exact
from specdec_properties.markov import MarkovPair, markov_pair, scheme_sequence_law, sequence_law, simulate
from specdec_properties.sampling import BackendOutputError, check_block_output
from specdec_properties.scenarios import STAT_SCENARIOS, for_scheme, to_float32_rows
from specdec_properties.stats import estimate_tv
from specdec_properties.strategies import distribution_pairs
from specdec_ref.backend import block_backend, no_bonus_backend, one_hot_draft_backend, reference_backend, typical_backend
from specdec_ref.contract import PAD_TOKEN, SCHEMES, Capabilities
from specdec_ref.schemes import BlockwiseVerifier
from specdec_ref.verify import BlockVerifier

load_check_modules()

LOSSLESS_SPECS = [
    exact.SchemeSpec(name, bonus=bonus) for name in ("token", "one_hot_draft", "block") for bonus in (True, False)
]


# ----------------------------------------------------------------------------- the oracle


def test_paper_example_block_verification_accepts_11_9_against_10_9():
    """Sun et al.'s motivating example: binary vocabulary, context-independent p = (1/3, 2/3),
    q = (2/3, 1/3), two drafts: token-wise verification accepts 10/9 drafts per block on average,
    block verification 11/9."""
    p = np.array([[1 / 3, 2 / 3]] * 3)
    q = np.array([[2 / 3, 1 / 3]] * 2)
    token = exact.block_law(exact.SchemeSpec("token"), p, q).mean_accepted()
    block = exact.block_law(exact.SchemeSpec("block"), p, q).mean_accepted()
    assert token == pytest.approx(10 / 9, abs=1e-12)
    assert block == pytest.approx(11 / 9, abs=1e-12)
    assert Fraction(block).limit_denominator(100) == Fraction(11, 9)


def test_paper_example_reproduced_by_the_reference_implementation():
    """The same example through BlockwiseVerifier: its accepted-length law fits the exact one."""
    from specdec_properties.stats import assert_fits

    from specdec_properties.sample_size import required_samples, with_margin

    gen = torch.Generator().manual_seed(5)
    q = torch.tensor([[2 / 3, 1 / 3]] * 2)
    p = torch.tensor([[1 / 3, 2 / 3]] * 3)
    law = exact.block_law(exact.SchemeSpec("block"), p.double().numpy(), q.double().numpy())
    n = with_margin(required_samples(law.length, 0.005))
    drafts = torch.multinomial(q, n, replacement=True, generator=gen).T.contiguous()
    m, _ = BlockwiseVerifier()(drafts, q.expand(n, -1, -1), p.expand(n, -1, -1), generator=gen)
    result = assert_fits(np.bincount(m.numpy(), minlength=3), law.length, what="paper example: accepted length", labels=["m=0", "m=1", "m=2"], tv=0.005)
    assert abs(float(m.double().mean()) - 11 / 9) < 0.01 and result.power >= 0.99


@settings(max_examples=60, deadline=None)
@given(pair=distribution_pairs())
def test_block_never_accepts_fewer_drafts_than_token_wise(pair):
    target, draft, _ = pair
    token = exact.block_law(exact.SchemeSpec("token"), target, draft)
    block = exact.block_law(exact.SchemeSpec("block"), target, draft)
    assert block.mean_accepted() >= token.mean_accepted() - 1e-9
    # the first emitted token follows row 0 under both, and position 0 stops with the same mass
    assert np.allclose(block.emitted(0), exact._rows(target)[0], atol=1e-9)
    assert block.length[0] == pytest.approx(token.length[0], abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(pair=distribution_pairs(max_k=3, max_vocab=8), bonus=st.booleans())
def test_token_wise_enumeration_equals_the_closed_form(pair, bonus):
    target, draft, _ = pair
    spec = exact.SchemeSpec("token", bonus=bonus)
    closed = exact.block_law(spec, target, draft)
    enumerated = exact.block_law(spec, target, draft, enumerate_drafts=True)
    assert np.allclose(closed.length, enumerated.length, atol=1e-12)
    reached = closed.reach[: closed.k] > 1e-9
    assert np.allclose(closed.steps[reached], enumerated.steps[reached], atol=1e-9)
    assert (closed.bonus is None) == (enumerated.bonus is None) == (not bonus)


@pytest.mark.parametrize("spec", LOSSLESS_SPECS, ids=lambda s: s.label.replace(", ", "-").replace(" ", "_"))
def test_every_lossless_oracle_scheme_has_the_targets_sequence_law(spec):
    """Decoding over rounds with the oracle's outcome law of each lossless scheme gives exactly the
    target's law of the first 3 tokens: the oracle's formulas are lossless as the schemes claim."""
    pair = markov_pair()
    assert np.abs(scheme_sequence_law(pair, spec, 3, 2) - sequence_law(pair, 3)).max() < 1e-14


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 4), k=st.integers(1, 3), name=st.sampled_from(["token", "one_hot_draft", "block"]))
def test_lossless_oracle_schemes_on_random_tables(seed, vocab, k, name):
    rng = np.random.default_rng(seed)
    pair = MarkovPair("random", to_float32_rows(rng.dirichlet(np.ones(vocab) * 0.5, vocab)),
                      to_float32_rows(rng.dirichlet(np.ones(vocab) * 0.5, vocab)), 0, "random tables")
    law = scheme_sequence_law(pair, exact.SchemeSpec(name), 3, k)
    assert np.abs(law - sequence_law(pair, 3)).max() < 1e-12


def test_typical_acceptance_oracle_is_lossy():
    pair = markov_pair()
    tv = 0.5 * np.abs(scheme_sequence_law(pair, exact.SchemeSpec("typical"), 3, 2) - sequence_law(pair, 3)).sum()
    assert 0.2 < tv < 0.5


def test_scenarios_for_the_one_hot_scheme_keep_their_stop_law_and_edges():
    for name, sc in STAT_SCENARIOS.items():
        adapted = for_scheme(sc, "one_hot_draft")
        law = exact.block_law(exact.SchemeSpec("one_hot_draft"), adapted.target, adapted.draft)
        reachable = law.length[law.length > 0]
        assert reachable.min() >= 0.1, (name, law.length)
        assert ((adapted.target == 0) == (sc.target == 0)).sum() >= (sc.target == 0).sum() - sc.k, name
        assert for_scheme(sc, "block") is sc and for_scheme(sc, "token") is sc


def test_near_equal_rows_are_near_equal_and_exact_in_float32():
    sc = STAT_SCENARIOS["near_equal"]
    p, q = sc.target[: sc.k], sc.draft
    ratio = q / p
    assert ((p == q).sum(1) >= 3).all()
    assert (((ratio > 0.94) & (ratio < 1.06)).sum(1) >= sc.vocab - 3).all()
    assert np.array_equal(p.astype(np.float32).astype(np.float64), p) and np.array_equal(q.astype(np.float32).astype(np.float64), q)
    assert np.allclose(exact.acceptance_probs(sc.target, sc.draft), 0.75, atol=1e-3)


# ----------------------------------------------------------------------------- the implementations


def test_no_bonus_emits_pad_after_a_fully_accepted_block():
    p = torch.tensor([[[0.5, 0.5]] * 3])
    d = torch.tensor([[0, 1]])
    m, tokens = BlockVerifier(bonus=False)(d, p[:, :2], p, generator=torch.Generator().manual_seed(0))
    assert int(m) == 2 and tokens.tolist() == [[0, 1, PAD_TOKEN]]
    check_block_output(d, (m, tokens), vocab=2, where="test", bonus=False)
    with pytest.raises(BackendOutputError, match="positions after m|not in"):
        check_block_output(d, (m, tokens), vocab=2, where="test", bonus=True)
    with_bonus = BlockVerifier()(d, p[:, :2], p, generator=torch.Generator().manual_seed(0))
    with pytest.raises(BackendOutputError, match="declares bonus=False"):
        check_block_output(d, with_bonus, vocab=2, where="test", bonus=False)


def test_capabilities_name_their_scheme():
    assert Capabilities().scheme == "token" and Capabilities().bonus and Capabilities().lossless
    assert not Capabilities(scheme="lossy").lossless
    with pytest.raises(ValueError, match="unknown verification scheme"):
        Capabilities(scheme="tree")
    assert set(SCHEMES) == {"token", "one_hot_draft", "block", "lossy"}
    assert block_backend().capabilities.scheme == "block" and not no_bonus_backend().capabilities.bonus
    assert one_hot_draft_backend().capabilities.scheme_label() == "one_hot_draft"


# ----------------------------------------------------------------------------- certification

#: The verifier checks whose laws depend on the scheme (plus the deterministic ones that are scheme-aware).
VERIFIER_CHECKS = sorted({c.check.name for c in all_cases() if c.check.family == "verifier" and "sampling" in c.check.requires})


@pytest.mark.parametrize("factory", [one_hot_draft_backend, block_backend, no_bonus_backend], ids=lambda f: f.__name__)
def test_each_exact_reference_scheme_is_certified_by_the_verifier_checks(factory):
    """`pytest conformance/ --specdec-backend=specdec_ref.backend:<factory>` in one call, at the ci profile."""
    backend = factory()
    records = run_checks(backend, CheckContext(profile="ci"), names=VERIFIER_CHECKS)
    bad = [(r.id, r.status, r.message[:500]) for r in records if r.status not in ("passed", "skipped")]
    assert not bad, bad
    cert = certificate_for_records(records, backend=backend, profile="ci")
    assert cert["verdict"]["headline"] == "CERTIFIED", cert["verdict"]
    skipped = {r.id for r in records if r.status == "skipped"}
    assert "sampling_sequence_law_over_rounds" not in skipped and "sampling_accepted_length_law-crossing" not in skipped


def test_the_lossy_reference_gets_a_lossy_verdict_covering_the_exact_distance():
    backend = typical_backend()
    records = run_checks(backend, CheckContext(profile="ci"), names=VERIFIER_CHECKS)
    assert all(r.status in ("passed", "skipped") for r in records), [(r.id, r.message[:300]) for r in records if r.status != "passed"]
    cert = certificate_for_records(records, backend=backend, profile="ci")
    headline = cert["verdict"]["headline"]
    assert headline.startswith(f"{LOSSY}: TV ") and not cert["certified"], headline
    (measured,) = [s for r in records for s in r.statistics if s.get("kind") == "tv_estimate"]
    pair = markov_pair()
    exact_tv = 0.5 * np.abs(scheme_sequence_law(pair, exact.SchemeSpec("typical"), 3, 2) - sequence_law(pair, 3)).sum()
    assert measured["lo"] <= exact_tv <= measured["hi"] and measured["hi"] - measured["lo"] < 0.1
    assert measured["gain"] > 1.0  # typical acceptance emits more tokens per call than token-wise from the same states


@pytest.mark.slow
def test_lossy_interval_coverage_calibration():
    """The 99% interval covers the exact TV of the reference lossy scheme in >= 99% of 200 seeds
    (20 000 sequences of 2 tokens each: 64 cells)."""
    pair, backend = markov_pair(), typical_backend()
    exact_tv = 0.5 * np.abs(scheme_sequence_law(pair, exact.SchemeSpec("typical"), 2, 2) - sequence_law(pair, 2)).sum()
    covered = 0
    for seed in range(200):
        run = simulate(backend, pair, 20_000, length=2, k=2, seed=seed)
        covered += estimate_tv(run.counts, sequence_law(pair, 2), what="calibration").covers(exact_tv)
    assert covered >= 198, f"covered {covered}/200 (exact TV {exact_tv:.4f})"


def test_the_reference_declares_token_wise_and_rejects_other_declarations_of_itself():
    """The token-wise reference declared as block verification fails the length law (named)."""
    import dataclasses

    backend = reference_backend()
    backend.capabilities = dataclasses.replace(backend.capabilities, scheme="block")
    case = next(c for c in all_cases(["sampling_accepted_length_law"]) if c.case_id == "crossing")
    record = run_case(case, backend, CheckContext(profile="dev"))
    assert record.status == "failed" and "scheme block" in record.message


@pytest.mark.parametrize("factory", [one_hot_draft_backend, block_backend, no_bonus_backend], ids=lambda f: f.__name__)
def test_each_exact_reference_scheme_decodes_losslessly_and_as_efficiently_as_its_law(factory):
    """The reference decoder around each scheme's verifier: the accepted drafts per round match the scheme's
    own exact expectation (ci scale), and the decoded text follows the exact law of the order-2 + position
    checkpoint (dev scale: N / 10, reduced power stated)."""
    backend = factory()
    (efficiency,) = run_checks(backend, CheckContext(profile="ci"), names=["decoder_acceptance_is_ideal"])
    assert efficiency.status == "passed" and efficiency.power == "full", efficiency.message[:1000]
    assert f"declared scheme ({backend.capabilities.scheme_label()})" in efficiency.statistics[0]["what"]
    case = next(c for c in all_cases(["decoder_sequence_law"]) if c.case_id == "position")
    record = run_case(case, backend, CheckContext(profile="dev"))
    assert record.status == "passed", record.message[:1000]
