"""specdec_ref.row_products: the harness's processes run with row-independent matrix products (the condition of seeded
batch invariance), and the probe that says so can say otherwise."""
import os
import subprocess
import sys

import torch

from specdec_ref.row_products import MKL_STRICT, linear, per_row_linear, row_dependent_products, uses_per_row_products


def test_the_harness_runs_with_row_independent_products():
    """tests/conftest.py asks MKL for its strict mode before the first product: without it an AVX-512 machine's one-row
    products differ in the last bit from the same rows in a batch, and a greedy draft at an exact tie flips
    (tests/test_proposers.py::test_seeded_rows_reproduce_alone_in_any_batch). Where the strict mode is not enough (an
    AMD EPYC), the reference's product is the per-row one."""
    found = row_dependent_products(linear)
    assert not found, (f"row b of the reference's product depends on the number of rows for (in, out, rows) = "
                       f"{found[:8]}; MKL_CBWR={os.environ.get('MKL_CBWR')!r} (want {MKL_STRICT!r}, set before the "
                       f"process's first product); per-row products: {uses_per_row_products()}")
    assert uses_per_row_products() == bool(row_dependent_products()), "the per-row product runs only where needed"


def test_the_per_row_product_is_row_independent_and_equals_the_product():
    """Bug class: a fallback that is itself batch-dependent, or computes another product (shape, bias, transposition)."""
    assert row_dependent_products(per_row_linear) == []
    gen = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(2, 5, 16, generator=gen), torch.randn(8, 16, generator=gen), torch.randn(8, generator=gen)
    got = per_row_linear(x, w, b)
    assert got.shape == (2, 5, 8) and torch.allclose(got, torch.nn.functional.linear(x, w, b), atol=1e-5)
    assert torch.allclose(per_row_linear(x, w), torch.nn.functional.linear(x, w), atol=1e-5)


def test_the_probe_sees_a_product_whose_rows_depend_on_the_batch(monkeypatch):
    """Bug class: a probe that cannot fail. A product that adds the row count's rounding noise is caught."""
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: real(x, w, b) * (1 + 2e-7 * (x.shape[0] > 1)))
    assert (16, 8, 2) in row_dependent_products()


def test_a_users_own_mkl_setting_wins():
    """The request only fills an unset MKL_CBWR: a process started with its own mode keeps it."""
    code = ("import os; from specdec_ref.row_products import request_row_independent_products as r; "
            "print(r(), os.environ['MKL_CBWR'])")
    env = dict(os.environ, MKL_CBWR="AVX2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "AVX2"]
    env.pop("MKL_CBWR")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", MKL_STRICT]


def test_a_batch_invariance_failure_names_row_dependent_products(monkeypatch):
    """An actionable report: where this process's products are row-dependent, batch_seeded_requests_reproduce_alone's
    failure says so and how to rerun without it; where they are not, the report has no such note."""
    import conformance.check_helpers as helpers
    import specdec_ref.row_products as products
    from conformance.registry import CheckContext, all_cases, run_case
    from specdec_fixtures.mutants import MUTANTS

    (case,) = all_cases(["batch_seeded_requests_reproduce_alone"])
    mutant = MUTANTS["decoder_one_stream_for_all_rows"].backend()
    record = run_case(case, mutant, CheckContext(profile="dev"))
    assert record.status == "failed" and "depends on its batch" in record.message, record.message[:1500]
    assert ("note: in this process" in record.message) == bool(row_dependent_products())
    monkeypatch.setattr(products, "row_dependent_products", lambda: [])
    record = run_case(case, mutant, CheckContext(profile="dev"))
    assert "note: in this process" not in record.message
    monkeypatch.setattr(products, "row_dependent_products", lambda: [(64, 64, 8)])
    record = run_case(case, mutant, CheckContext(profile="dev"))
    assert record.status == "failed" and "note: in this process row b of a float32 F.linear" in record.message
    assert "(in, out, rows) = (64, 64, 8)" in record.message and f"MKL_CBWR={MKL_STRICT}" in record.message
    assert helpers.row_dependence_note() != ""
