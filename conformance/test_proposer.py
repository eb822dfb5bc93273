"""Conformance of decoders drafting with proposers (prompt lookup, EAGLE, EAGLE-3, MTP and Medusa heads; Medusa trees):
one test per registered check case."""
import pytest

from conformance.plugin import case_params, run_case_in_pytest


@pytest.mark.parametrize("case", case_params("proposer"))
def test_proposer(case, request, specdec_backend, specdec_ctx):
    run_case_in_pytest(request, case, specdec_backend, specdec_ctx)
