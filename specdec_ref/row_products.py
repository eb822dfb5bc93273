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

The strict mode is not enough on every machine (on an AMD EPYC with MKL 2024.2 no ``MKL_CBWR`` mode makes one-row
products equal the batched rows). So the reference computes its products with :func:`linear`: ``F.linear`` where the
probe finds this process's products row-independent, else :func:`per_row_linear` (one one-row product per row, the
same kernel whatever the batch), which holds by construction and is probed too.
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


def row_dependent_products(product=None) -> list[tuple[int, int, int]]:
    """The probe's float32 CPU ``(in, out, rows)`` products whose rows differ from the same rows multiplied one at a
    time (empty: the products in force are row-independent for these widths). ``product(x, w)``: default
    ``F.linear`` as this process runs it."""
    import torch
    import torch.nn.functional as F

    product = product or (lambda x, w: F.linear(x, w))
    gen = torch.Generator().manual_seed(0)
    found = []
    for k, n in PROBE_WIDTHS:
        w = torch.randn(n, k, generator=gen)
        x = torch.randn(max(PROBE_ROWS), k, generator=gen)
        alone = torch.cat([product(x[i:i + 1], w) for i in range(len(x))])
        found += [(k, n, m) for m in PROBE_ROWS if not torch.equal(product(x[:m], w), alone[:m])]
    return found


def per_row_linear(x, w, b=None):
    """``F.linear(x, w, b)`` as one one-row product per row of ``x [..., in]`` (a batched product of ``[1, in]``
    matrices): row-independent by construction, 3-11x slower than one batched product for large batches."""
    import torch

    rows = x.reshape(-1, 1, x.shape[-1])
    out = torch.bmm(rows, w.t().unsqueeze(0).expand(rows.shape[0], -1, -1)).reshape(*x.shape[:-1], w.shape[0])
    return out if b is None else out + b


_PER_ROW: bool | None = None  # None: not probed yet in this process


def uses_per_row_products() -> bool:
    """Whether :func:`linear` runs :func:`per_row_linear` in this process: probed once, at its first call (after the
    MKL request, which must precede every product). A process where neither product is row-independent is refused."""
    global _PER_ROW
    if _PER_ROW is None:
        per_row = bool(row_dependent_products())
        if per_row and row_dependent_products(per_row_linear):
            raise RuntimeError("neither F.linear nor the per-row product is row-independent in this process: seeded "
                               "requests cannot decode bit for bit the same alone and in a batch (docs/batching.md)")
        _PER_ROW = per_row
    return _PER_ROW


def linear(x, w, b=None):
    """The reference's matrix product: ``F.linear(x, w, b)``, row ``i`` the same whatever the number of rows (the
    probe is of CPU products: other devices run ``F.linear`` as they are)."""
    import torch.nn.functional as F

    return per_row_linear(x, w, b) if x.device.type == "cpu" and uses_per_row_products() else F.linear(x, w, b)

