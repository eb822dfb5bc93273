"""Benchmarks of the reference implementation and of the conformance suite (``specdec-bench``, ``python -m specdec_bench``).

The tools sit on top of everything else: they import the reference (``specdec_ref``) and the suite
(``conformance``, ``properties``), and nothing there imports them.

* :mod:`specdec_bench.kit`: table formatting, timing, the environment header, percentiles, argument-list parsers.
* :mod:`specdec_bench.verifier`, :mod:`specdec_bench.checks`, :mod:`specdec_bench.decoder`: one benchmark each.
* :mod:`specdec_bench.cli`: the command line (:func:`specdec_bench.cli.main`).
"""
