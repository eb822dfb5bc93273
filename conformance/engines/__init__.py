"""Certification of real engines: one engine-neutral layer and one folder per engine (docs/engines.md).

``python -m conformance.engines ENGINE --out DIR`` runs the shared runner (:mod:`conformance.engines.runner`) on the
adapter registered as ``ENGINE`` (:data:`conformance.engines.adapter.ADAPTERS`); ``python -m conformance.engines
export ENGINE`` writes its checkpoints and checks them; ``bash scripts/stage.sh ENGINE`` is its CI stage. Nothing in
this package is imported by the suite itself; ``import conformance`` never touches an engine, and an adapter imports
its engine only in the worker process.
"""
