"""The reference backend: what ``pytest conformance/`` certifies by default."""
from __future__ import annotations

import torch

from . import __version__
from .contract import Capabilities
from .verify import verify_block


class ReferenceBackend:
    """specdec_ref's own verifier behind the backend contract."""

    name = "specdec_ref.reference"
    version = __version__
    capabilities = Capabilities(
        verifier=True,
        greedy=True,
        sampling=True,
        batched=True,
        dtypes=("float32", "float64", "bfloat16", "float16"),
        devices=("cpu", "cuda"),
    )

    def __init__(self, *, validate: bool = True):
        self.validate = validate

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator: torch.Generator | None = None):
        return verify_block(draft_tokens, draft_probs, target_probs, generator=generator, validate=self.validate)


def reference_backend() -> ReferenceBackend:
    """Factory named by the default ``--specdec-backend``."""
    return ReferenceBackend()
