"""ONNX Runtime GenAI: the adapter (:mod:`.adapter`: its builder's conversion, the logit check, the session)."""
from .adapter import ADAPTER

__all__ = ["ADAPTER"]
