"""Conformance of the batched speculative decoder (ragged requests, per-request settings and seeds): one test per registered check case."""
import pytest

from conformance.plugin import case_params, run_case_in_pytest


@pytest.mark.parametrize("case", case_params("batch"))
def test_batch(case, request, specdec_backend, specdec_ctx):
    run_case_in_pytest(request, case, specdec_backend, specdec_ctx)
