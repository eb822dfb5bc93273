"""Conformance of the speculative decoder on real transformers models: one test per registered check case."""
import pytest

from conformance.plugin import run_case_in_pytest
from conformance.registry import all_cases

CASES = [c for c in all_cases() if "decoder" in c.check.requires]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id, marks=[pytest.mark.xdist_group(c.group), pytest.mark.requires(*c.check.requires)])
        for c in CASES
    ],
)
def test_decoder(case, request, specdec_backend, specdec_ctx):
    run_case_in_pytest(request, case, specdec_backend, specdec_ctx)
