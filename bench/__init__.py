"""Benchmarks of the reference implementation and of the conformance suite (``specdec-bench``, ``python -m bench``).

The tools sit on top of everything else: they import the reference (``specdec_ref``) and the suite
(``conformance``, ``properties``), and nothing there imports them.

* :mod:`bench.kit`: table formatting, timing, the environment header, percentiles, argument-list parsers.
* :mod:`bench.verifier`, :mod:`bench.checks`, :mod:`bench.decoder`: one benchmark each.
* :mod:`bench.cli`: the command line (:func:`bench.cli.main`).
"""
