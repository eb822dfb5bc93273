"""The multi-round sequence-law check certifies losslessness, not one algorithm.

A verifier that treats the draft as one-hot (accept d with probability p(d); on rejection sample p
with d removed) is exact for any draft, but its per-block laws are not token-wise rejection
sampling's: the per-block checks reject it, the sequence-law check passes it at full power, and the
exact law itself is checked against brute-force enumeration.
"""
import itertools

import numpy as np
import pytest
import torch

from conformance.registry import CheckContext, all_cases, run_case
from specdec_properties.markov import markov_pair, sequence_labels, sequence_law
from specdec_ref.contract import PAD_TOKEN, Capabilities, NotSupportedError


class OneHotDraftVerifier:
    """Exact for any draft: P(emit y) = p(d)[y = d] + (1 - p(d)) p(y) [y != d] / (1 - p(d)) = p(y)."""

    name, version = "test.one-hot-draft", "1"
    capabilities = Capabilities(verifier=True, sampling=True, batched=True)

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        if draft_probs is None:
            raise NotSupportedError("sampling only")
        batch, k = draft_tokens.shape
        p = target_probs.float()
        p_d = p[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)
        accepted = torch.rand(batch, k, generator=generator) < p_d
        m = accepted.long().cumprod(1).sum(1)
        rows = torch.arange(batch)
        weights = p[rows, m].clone()
        stopped = (m < k).nonzero().squeeze(1)
        weights[stopped, draft_tokens[stopped, m[stopped]]] = 0.0  # the rejected draft is removed from p
        final = torch.multinomial(weights, 1, generator=generator).squeeze(1)
        tokens = torch.full((batch, k + 1), PAD_TOKEN, dtype=torch.long)
        tokens[:, :k] = torch.where(torch.arange(k)[None, :] < m[:, None], draft_tokens, PAD_TOKEN)
        tokens[rows, m] = final
        return m, tokens


def _case(check: str, case_id: str = ""):
    return next(c for c in all_cases([check]) if c.case_id == case_id)


def test_sequence_law_is_the_product_of_the_target_rows():
    pair = markov_pair()
    law = sequence_law(pair, 3)
    labels = sequence_labels(pair.vocab, 3)
    for cell, seq in itertools.islice(enumerate(itertools.product(range(pair.vocab), repeat=3)), 0, None, 37):
        expected = pair.target[pair.start, seq[0]] * pair.target[seq[0], seq[1]] * pair.target[seq[1], seq[2]]
        assert law[cell] == pytest.approx(expected, rel=1e-12) and labels[cell] == " ".join(map(str, seq))
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(pair.acceptance(), 0.7) and (pair.target != pair.draft).any(1).all()


def test_an_exact_scheme_other_than_token_wise_passes_the_sequence_law_at_full_power():
    record = run_case(_case("sampling_sequence_law_over_rounds"), OneHotDraftVerifier(), CheckContext())
    assert record.status == "passed" and record.power == "full", record.message[:2000]
    (stat,) = record.statistics
    assert stat["tv"] == 0.005 and stat["power"] >= 0.99 and stat["detects"] <= 0.005


def test_the_token_wise_per_block_law_rejects_that_exact_scheme_declared_token_wise():
    """Declared ``token`` (the default), the per-block laws are token-wise rejection sampling's: they reject it."""
    record = run_case(_case("sampling_accepted_length_law", "balanced"), OneHotDraftVerifier(), CheckContext(profile="dev"))
    assert record.status == "failed" and "accepted length m vs its exact law" in record.message


class DeclaredOneHotDraft(OneHotDraftVerifier):
    capabilities = Capabilities(verifier=True, sampling=True, batched=True, scheme="one_hot_draft")


@pytest.mark.parametrize("check, case_id", [
    ("sampling_accepted_length_law", "crossing"),
    ("sampling_residual_at_j", "near_equal-j1"),
    ("sampling_accept_and_token_at_j", "balanced-j2"),
])
def test_an_independent_implementation_declaring_its_scheme_passes_that_schemes_per_block_laws(check, case_id):
    """The same third-party verifier, declaring ``one_hot_draft``, passes the per-block laws of that
    scheme (computed by the oracle, independently of both implementations) at full power."""
    record = run_case(_case(check, case_id), DeclaredOneHotDraft(), CheckContext())
    assert record.status == "passed" and record.power == "full", record.message[:2000]
