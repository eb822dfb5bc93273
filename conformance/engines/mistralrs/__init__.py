"""mistral.rs: the adapter (:mod:`.adapter`) for 0.9.5 (``ADAPTER``) and 0.6.0 (``ADAPTER_060``)."""
from .adapter import ADAPTER, ADAPTER_060

__all__ = ["ADAPTER", "ADAPTER_060"]
