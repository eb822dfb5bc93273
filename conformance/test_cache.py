"""Conformance of the backend's KV cache: one test per registered check case."""
import pytest

from conformance.plugin import case_params, run_case_in_pytest


@pytest.mark.parametrize("case", case_params("cache"))
def test_cache(case, request, specdec_backend, specdec_ctx):
    run_case_in_pytest(request, case, specdec_backend, specdec_ctx)
