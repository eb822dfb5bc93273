"""Shared fixtures of the harness's own tests."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One intra-op thread: tiny models only pay OpenMP barrier costs for more, and on a loaded
    2-core machine a 24-token forward went from 0.7 ms (1 thread) to 420 ms (2 threads)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
