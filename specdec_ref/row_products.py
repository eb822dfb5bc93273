"""Row-independent matrix products: the condition under which a seeded request decodes bit for bit the same alone or
in any batch (docs/batching.md).

Invariant the batched decoders rely on: row ``b`` of ``F.linear(x, w)`` does not depend on how many rows ``x`` has.
MKL's default kernels do not promise it. On an AVX-512 machine a one-row product runs another kernel than an
eight-row one and the two differ in the last bit, for every width we tried; a greedy draft at an exact tie (the exact
MTP head has two) then depends on the batch. MKL's strict conditional-numerical-reproducibility mode
(``MKL_CBWR=AUTO,STRICT``) makes the products row-independent (its cost, measured: docs/batching.md).

MKL reads ``MKL_CBWR`` at its first call, so :func:`request_row_independent_products` works only before the process's
first matrix product; the reference backend and the harness's own tests ask for it at start, and only where the
variable is unset (a user's own setting wins). :func:`row_dependent_products` probes the mode in force. The
request is not made for a third-party backend: its products are certified as its users run them.
"""
from __future__ import annotations

import os

MKL_STRICT = "AUTO,STRICT"

#: ``(in, out)`` widths of the probe: the tiny models' hidden, fused and vocabulary widths.
PROBE_WIDTHS = ((16, 8), (32, 16), (64, 8), (64, 64), (64, 192), (128, 64), (256, 64))
PROBE_ROWS = (2, 3, 5, 8, 13, 16, 17, 33, 64, 100)


def request_row_independent_products() -> bool:
    """Ask MKL for its strict reproducible mode unless ``MKL_CBWR`` is already set; True when this call set it."""
    if "MKL_CBWR" in os.environ:
        return False
    os.environ["MKL_CBWR"] = MKL_STRICT
    return True


def row_dependent_products() -> list[tuple[int, int, int]]:
    """The probe's float32 CPU ``(in, out, rows)`` products whose rows differ from the same rows multiplied one at a
    time (empty: the products in force are row-independent for these widths)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    found = []
    for k, n in PROBE_WIDTHS:
        w = torch.randn(n, k, generator=gen)
        x = torch.randn(max(PROBE_ROWS), k, generator=gen)
        alone = torch.cat([F.linear(x[i:i + 1], w) for i in range(len(x))])
        found += [(k, n, m) for m in PROBE_ROWS if not torch.equal(F.linear(x[:m], w), alone[:m])]
    return found

