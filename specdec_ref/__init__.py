"""specdec_ref: a reference implementation of speculative decoding, the oracle the conformance suite compares against."""
__version__ = "0.1.0"
