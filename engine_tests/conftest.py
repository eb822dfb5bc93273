"""Engine tests' shared set-up: with ``SPECDEC_PIN_XDIST=1``, each pytest-xdist worker (and every engine process it
starts) runs on its own share of this machine's CPUs, as the engine runner's pinned workers do
(:attr:`conformance.engines.adapter.EngineAdapter.pin_workers`): vLLM binds its threads to every CPU it may use, so two
workers' engines on the same cores spin against each other."""
from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if os.environ.get("SPECDEC_PIN_XDIST") != "1" or not worker.startswith("gw") or count < 2 \
            or not hasattr(os, "sched_getaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= count:
        os.sched_setaffinity(0, cpus[int(worker[2:]) % count::count])


@pytest.fixture(scope="session", autouse=True)
def _imports_out_of_the_collectors_reach():
    """After collection (every engine imported), the imports' objects frozen (:mod:`conformance.heap`): vLLM runs
    ``gc.collect()`` several times per engine start, each about a second over the imports' objects; frozen, they are
    skipped (objects made later are collected as before)."""
    from conformance.heap import freeze_long_lived

    freeze_long_lived()
    yield
