"""Certification of real engines: adapters and runners imported only where the engine is installed.

Nothing in this package is imported by the suite itself; ``import conformance`` never touches an engine.
"""
