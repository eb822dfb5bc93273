"""Shared fixtures of the harness's own tests."""
import pytest

from specdec_ref.row_products import request_row_independent_products

request_row_independent_products()  # before the first matrix product: seeded rows reproduce alone in any batch

import torch  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One intra-op thread: tiny models only pay OpenMP barrier costs for more, and on a loaded
    2-core machine a 24-token forward went from 0.7 ms (1 thread) to 420 ms (2 threads)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
