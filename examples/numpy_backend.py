"""A third-party backend in 45 lines: a NumPy block verifier, certified with `pytest conformance/`.

    python -m pytest --pyargs conformance --specdec-backend=examples.numpy_backend:factory \
        -n 2 --dist loadgroup --specdec-report numpy-cert.json
"""
import numpy as np
import torch

from specdec_ref.contract import Capabilities


class NumpyVerifier:
    name, version = "example.numpy", "1.0"
    capabilities = Capabilities(verifier=True, greedy=True, sampling=True, batched=True)

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        d = draft_tokens.numpy()
        p = target_probs.double().numpy()
        batch, k = d.shape
        rows, cols = np.arange(batch), np.arange(k)
        # all randomness from the caller's generator
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        if draft_probs is None:  # greedy: accept while the draft is the target's argmax
            choice = p.argmax(-1)
            ok = d == choice[:, :k]
            m = np.where(ok.all(1), k, (~ok).argmax(1))
            final = choice[rows, m]
        else:  # accept d with probability min(1, p(d)/q(d)), stop at the first rejection
            q = draft_probs.double().numpy()
            p_d = p[rows[:, None], cols, d]
            q_d = q[rows[:, None], cols, d]
            ok = rng.random((batch, k)) * q_d < p_d
            m = np.where(ok.all(1), k, (~ok).argmax(1))
            # replacement ~ [p - q]_+ at the stopping row; row k (bonus) has no draft row
            p_m = p[rows, m]
            q_m = np.where((m < k)[:, None], q[rows, np.minimum(m, k - 1)], 0.0)
            w = np.clip(p_m - q_m, 0.0, None)
            w = np.where(w.sum(1, keepdims=True) > 1e-12, w, p_m)
            cdf = np.cumsum(w, 1)
            final = (cdf <= rng.random((batch, 1)) * cdf[:, -1:]).sum(1)
        tokens = np.full((batch, k + 1), -1, dtype=np.int64)
        tokens[:, :k] = np.where(cols < m[:, None], d, -1)
        tokens[rows, m] = final
        return torch.from_numpy(m.astype(np.int64)), torch.from_numpy(tokens)


def factory():
    return NumpyVerifier()
