"""A strict batch-1 verifier, as many engines' kernels are: it answers B = 1 calls only.

It declares ``batched=False``, so the suite calls it one row at a time and caps its samples
(``specdec_properties.sample_size``): it is certified *at reduced power*, and the verdict says which
deviations (in total variation) it can still rule out.

    python -m pytest --pyargs conformance --specdec-backend=examples.batch1_backend:factory
"""
from specdec_ref.contract import Capabilities, NotSupportedError

from .numpy_backend import NumpyVerifier


class Batch1Verifier(NumpyVerifier):
    name = "example.numpy-batch1"
    capabilities = Capabilities(verifier=True, greedy=True, sampling=True, batched=False)

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        if draft_tokens.shape[0] != 1:
            raise NotSupportedError(f"{self.name} verifies one block per call, got B={draft_tokens.shape[0]}")
        return super().verify(draft_tokens, draft_probs, target_probs, generator=generator)


def factory():
    return Batch1Verifier()
