"""Conformance of the tree_decoder checks: one test per registered check case."""
import pytest

from conformance.plugin import case_params, run_case_in_pytest


@pytest.mark.parametrize("case", case_params("tree_decoder"))
def test_tree_decoder(case, request, specdec_backend, specdec_ctx):
    run_case_in_pytest(request, case, specdec_backend, specdec_ctx)
