"""A backend that misbehaves gets a named failure per check, never a crashed harness."""
import pytest

from conformance.registry import CheckContext, all_cases, run_case
from specdec_ref.backend import ReferenceBackend


class Misbehaving(ReferenceBackend):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        m, tokens = super().verify(draft_tokens, draft_probs, target_probs, generator=generator)
        if self.how == "raises":
            raise RuntimeError("engine exploded")
        if self.how == "float tokens":
            return m, tokens.float().fill_(float("nan"))
        if self.how == "wrong shape":
            return m, tokens[:, :-1]
        if self.how == "out of range":
            return m, tokens.scatter(1, m[:, None], target_probs.shape[-1] + 3)
        if self.how == "m too large":
            return m + 10, tokens
        if self.how == "not a tuple":
            return tokens
        raise AssertionError(self.how)


EXPECTED = {
    "raises": ("error", "RuntimeError: engine exploded"),
    "float tokens": ("failed", "tokens must be int64"),
    "wrong shape": ("failed", "tokens must have shape"),
    "out of range": ("failed", "is not in [0,"),
    "m too large": ("failed", "is outside [0,"),
    "not a tuple": ("failed", "must return (num_accepted, tokens)"),
}


@pytest.mark.parametrize("how", list(EXPECTED))
def test_named_failure(how):
    status, fragment = EXPECTED[how]
    for name in ("structure_sampling", "sampling_seeded_reproducible"):
        (case,) = all_cases([name])
        record = run_case(case, Misbehaving(how), CheckContext())
        assert record.status == status, (how, name, record.status, record.message[:500])
        assert fragment in record.message, record.message[:500]


def test_statistical_check_names_the_structural_failure_before_counting():
    (case, *_) = all_cases(["sampling_first_token_follows_row0"])
    record = run_case(case, Misbehaving("out of range"), CheckContext(profile="dev"))
    assert record.status == "failed" and "blocks 0.." in record.message and "is not in [0," in record.message


class ClaimsBatchedButIsNot(ReferenceBackend):
    """Claims `batched` (the reference's capabilities) but refuses B > 1."""

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        from specdec_ref.contract import NotSupportedError

        if draft_tokens.shape[0] > 1:
            raise NotSupportedError("one block per call")
        return super().verify(draft_tokens, draft_probs, target_probs, generator=generator)


def test_a_claim_the_backend_does_not_honour_fails():
    (case,) = all_cases(["sampling_seeded_reproducible"])
    record = run_case(case, ClaimsBatchedButIsNot(), CheckContext())
    assert record.status == "failed" and "raised NotSupportedError: one block per call" in record.message
