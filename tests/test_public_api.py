"""conformance's public API (scikit-learn style): run_checks, certificate_for_records, parametrize_with_checks."""
import torch

from conformance import certificate_for_records, parametrize_with_checks, run_checks
from conformance.registry import CheckContext, all_cases, run_case
from examples.numpy_backend import NumpyVerifier
from specdec_ref.backend import ReferenceBackend

CHEAP = ["structure_greedy", "structure_sampling", "sampling_seeded_reproducible", "unclaimed_modes_raise_not_supported"]


@parametrize_with_checks([NumpyVerifier()], names=CHEAP + ["decoder_rejects_bad_input"])
def test_numpy_backend_with_parametrize_with_checks(backend, check):
    check(backend)  # decoder_rejects_bad_input is skipped: the example does not claim `decoder`


def test_run_checks_records_and_the_same_verdict_as_the_plugin():
    backend = NumpyVerifier()
    records = run_checks(backend, CheckContext(profile="dev"), names=CHEAP + ["decoder_rejects_bad_input"])
    assert [r.status for r in records] == ["passed"] * 4 + ["skipped"]
    assert "does not claim capability decoder" in records[-1].message
    cert = certificate_for_records(records, backend=backend, profile="dev")
    assert cert["verdict"]["headline"] == "CERTIFIED" and cert["totals"]["skipped"] == 1


class NeverStopsAtZero(ReferenceBackend):
    """Never rejects d_1 (a rejection at position 0 becomes an acceptance of d_1 and a bonus-free stop at 1)."""

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        m, tokens = super().verify(draft_tokens, draft_probs, target_probs, generator=generator)
        stop0 = m == 0
        m = torch.where(stop0, torch.ones_like(m), m)
        tokens[stop0, 0] = draft_tokens[stop0, 0]
        tokens[stop0, 1] = tokens[stop0, 0]
        tokens[stop0, 2:] = -1
        return m, tokens


def test_a_statistical_check_with_no_samples_is_inconclusive_never_passed():
    """residual at j=0 has N = 0 when the backend never stops at 0: inconclusive, naming the test; the
    length law on the same sample fails (the bug itself)."""
    backend = NeverStopsAtZero()
    (residual,) = [c for c in all_cases(["sampling_residual_at_j"]) if c.case_id == "balanced-j0"]
    record = run_case(residual, backend, CheckContext(profile="dev"))
    assert record.status == "inconclusive" and record.power == "inconclusive", (record.status, record.message[:500])
    assert "N=0" in record.message and "not a pass" in record.message
    (length,) = [c for c in all_cases(["sampling_accepted_length_law"]) if c.case_id == "balanced"]
    assert run_case(length, backend, CheckContext(profile="dev")).status == "failed"
    cert = certificate_for_records([record], backend=backend)
    assert cert["verdict"]["headline"] == "NOT CERTIFIED: 1 inconclusive"
