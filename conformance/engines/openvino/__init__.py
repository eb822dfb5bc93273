"""OpenVINO GenAI: the adapter (:mod:`.adapter`), the IR export and its logit check (:mod:`.export`), the engine's
sampler re-implemented (:mod:`.model`) and the matrix's speculative completions against it (:mod:`.check`)."""
from .adapter import ADAPTER

__all__ = ["ADAPTER"]
