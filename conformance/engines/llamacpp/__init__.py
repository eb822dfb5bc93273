"""llama.cpp (llama-server built from llama-cpp-python 0.3.36's vendored source): the adapter (:mod:`.adapter`), the
GGUF files of the exactly-known models (:mod:`.gguf_export`) and of the heads (:mod:`.gguf_heads`)."""
from .adapter import ADAPTER

__all__ = ["ADAPTER"]
