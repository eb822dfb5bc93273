"""Drive a backend's ``verify_tree``: structure-check every output, draft trees as each scheme requires, count outcomes.

Trees for the statistical checks are drafted from Markov tables (:class:`specdec_properties.markov.MarkovPair`):
node ``i``'s token is drawn from ``draft[token of its parent]`` (``draft[start]`` under the root), and
its target row is ``target[its own token]`` (``target[start]`` at the root), so siblings with the same
token have the same rows, as with a real model. How siblings are drawn is the declared scheme's
(:func:`draw_markov_trees`): i.i.d. for ``specinfer``, without replacement for ``recursive``, the
draft row's most likely tokens for ``deterministic`` (and ``lossy``, e.g. threshold kernels).
Trees are drafted on the CPU; what ``verify_tree`` gets is put on the device under test by
:func:`specdec_properties.sampling.on_device` (and its generator made there, :func:`specdec_properties.sampling.device_generator`).
"""
from __future__ import annotations

import numpy as np
import torch

from specdec_ref.contract import PAD_TOKEN
from specdec_ref.verify import sample_from_weights

from .markov import MarkovPair, rounds_sampler
from .sampling import BackendOutputError, call_backend, device_generator, integer_outputs, is_batched, on_device, row_generator

#: Schemes whose trees have distinct sibling tokens (drafted without replacement or deterministically).
DISTINCT_SIBLINGS = ("recursive", "deterministic", "lossy")


def tree_scheme_of(backend) -> str:
    """The backend's declared tree scheme (``Capabilities.tree_scheme``)."""
    return getattr(getattr(backend, "capabilities", None), "tree_scheme", "specinfer")


def check_tree_output(draft_tokens: torch.Tensor, parents: torch.Tensor, result, *, vocab: int, where: str):
    """Structural contract of one ``verify_tree`` output; raises :class:`BackendOutputError` naming the row.

    ``0 <= m``; ``path[:m]`` are real nodes, the first a child of the root and each the child of the
    previous one; ``path[m:] == -1``; ``tokens[:m]`` are the path's tokens, ``tokens[m]`` is in
    ``[0, V)``, ``tokens[m+1:] == -1``. Returns ``(m, path, tokens)`` as int64 CPU tensors.
    """
    __tracebackhide__ = True
    batch, n = draft_tokens.shape
    shapes = {"num_accepted": (batch,), "path": (batch, n), "tokens": (batch, n + 1)}
    m, path, tokens = integer_outputs(result, shapes, call="verify_tree()", where=where)
    drafts, parents = draft_tokens.long().cpu(), parents.long().cpu()
    real = (drafts >= 0).sum(1)

    def first(bad: torch.Tensor) -> int | None:
        rows = bad.reshape(batch, -1).any(1).nonzero()
        return int(rows[0]) if len(rows) else None

    if (b := first((m < 0) | (m > real))) is not None:
        raise BackendOutputError(f"{where}: row {b}: num_accepted = {int(m[b])} is outside [0, {int(real[b])}] (the row's node count)")
    slots = torch.arange(n)
    on_path = slots[None, :] < m[:, None]
    node = path.clamp(0, n - 1)
    if (b := first(on_path & ((path < 0) | (path >= real[:, None])))) is not None:
        raise BackendOutputError(f"{where}: row {b}: path {path[b, : int(m[b])].tolist()} names a node that is not one of the row's {int(real[b])} nodes")
    previous = torch.cat([torch.full((batch, 1), -1), path[:, :-1]], 1)
    if (b := first(on_path & (parents.gather(1, node) != previous))) is not None:
        raise BackendOutputError(
            f"{where}: row {b}: accepted path {path[b, : int(m[b])].tolist()} (parents {parents[b].tolist()}) is not a "
            "root-to-node path: each accepted node must be the child of the previous one, the first a child of the root"
        )
    if (b := first(on_path & (tokens[:, :n] != drafts.gather(1, node)))) is not None:
        raise BackendOutputError(
            f"{where}: row {b}: tokens {tokens[b, : int(m[b])].tolist()} are not the tokens "
            f"{drafts[b].gather(0, node[b, : int(m[b])]).tolist()} of the accepted nodes {path[b, : int(m[b])].tolist()}"
        )
    if (b := first(~on_path & (path != PAD_TOKEN))) is not None:
        raise BackendOutputError(f"{where}: row {b}: path after the {int(m[b])} accepted nodes must be -1, got {path[b].tolist()}")
    if (b := first((torch.arange(n + 1)[None, :] > m[:, None]) & (tokens != PAD_TOKEN))) is not None:
        raise BackendOutputError(f"{where}: row {b}: tokens after the final token must be -1, got {tokens[b].tolist()}")
    final = tokens.gather(1, m[:, None]).squeeze(1)
    if (b := first((final < 0) | (final >= vocab))) is not None:
        raise BackendOutputError(f"{where}: row {b}: the final token tokens[{int(m[b])}] = {int(final[b])} is not in [0, {vocab})")
    return m, path, tokens


def verify_tree_rows(backend, draft_tokens, parents, draft_probs, target_probs, *, generator, where: str, vocab: int, device=None):
    """``verify_tree`` on a batch (one B = 1 call per row for a backend not claiming ``batched``), structure-checked.

    The generator is threaded through the calls in row order. Returns ``(m[B], path[B, n], tokens[B, n+1])`` on the
    CPU. ``device``: where the inputs are put (:func:`specdec_properties.sampling.on_device`; the generators must already
    live there); ``None`` leaves them where they are.
    """
    __tracebackhide__ = True
    draft_tokens, parents, draft_probs, target_probs = on_device(draft_tokens, parents, draft_probs, target_probs, device=device)
    if is_batched(backend):
        out = call_backend(backend.verify_tree, draft_tokens, parents, draft_probs, target_probs, generator=generator, what=f"verify_tree() ({where})")
        return check_tree_output(draft_tokens, parents, out, vocab=vocab, where=where)
    parts = []
    for i in range(draft_tokens.shape[0]):
        row = slice(i, i + 1)
        dp = None if draft_probs is None else draft_probs[row]
        row_where = f"{where} (row {i}, one B=1 call per row)"
        out = call_backend(
            backend.verify_tree, draft_tokens[row], parents[row], dp, target_probs[row], generator=row_generator(generator, i),
            what=f"verify_tree() ({row_where})",
        )
        parts.append(check_tree_output(draft_tokens[row], parents[row], out, vocab=vocab, where=row_where))
    return tuple(torch.cat(ts) for ts in zip(*parts))


def sibling_index(parents: np.ndarray) -> np.ndarray:
    """Position of each node among its siblings (0 for the first child of its parent)."""
    seen: dict[int, int] = {}
    out = np.zeros(len(parents), dtype=np.int64)
    for i, parent in enumerate(parents):
        out[i] = seen.get(int(parent), 0)
        seen[int(parent)] = out[i] + 1
    return out


def draw_markov_trees(scheme: str, parents: np.ndarray, pair: MarkovPair, starts: torch.Tensor, generator: torch.Generator):
    """One tree of shape ``parents`` per start token, drafted as ``scheme`` requires, with its rows.

    Returns ``(draft_tokens[B, n], parents[B, n], draft_probs[B, n, V], target_probs[B, n+1, V])``
    (float32 rows from the pair's tables).
    """
    target = torch.tensor(pair.target, dtype=torch.float32)
    draft = torch.tensor(pair.draft, dtype=torch.float32)
    batch, n, vocab = len(starts), len(parents), pair.vocab
    order = sibling_index(parents)
    tokens = torch.empty(batch, n, dtype=torch.long)
    qs = torch.empty(batch, n, vocab)
    taken = {}  # parent slot -> tokens already drawn under it, one-hot [B, V]
    ranked = {}
    for i, parent in enumerate(parents):
        context = starts if parent < 0 else tokens[:, parent]
        q = draft[context]
        qs[:, i] = q
        if scheme == "specinfer":
            tokens[:, i] = sample_from_weights(q, generator)
        elif scheme == "recursive":
            used = taken.setdefault(int(parent), torch.zeros(batch, vocab))
            left = q * (used == 0)
            empty = left.sum(1, keepdim=True) == 0  # more siblings than support: any unused token
            left = torch.where(empty, (used == 0).float(), left)
            tokens[:, i] = sample_from_weights(left, generator)
            used[torch.arange(batch), tokens[:, i]] = 1.0
        elif scheme in ("deterministic", "lossy"):
            if int(parent) not in ranked:
                ranked[int(parent)] = torch.sort(q, dim=1, descending=True, stable=True).indices
            tokens[:, i] = ranked[int(parent)][:, order[i]]
        else:
            raise ValueError(f"no drafting protocol for tree scheme {scheme!r}")
    contexts = torch.cat([starts[:, None], tokens], 1)
    tree = torch.as_tensor(parents, dtype=torch.long).expand(batch, n).clone()
    return tokens, tree, qs, target[contexts]


def end_cells(m: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cell ``end * V + final`` per row: ``end`` 0 for the root, ``i + 1`` for node ``i`` (``specdec_properties.tree_exact.outcome_law``'s layout)."""
    last = path.gather(1, (m - 1).clamp_min(0)[:, None]).squeeze(1)
    end = torch.where(m > 0, last + 1, 0)
    return end * vocab + tokens.gather(1, m[:, None]).squeeze(1)


def depth_cells(m: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cell ``m * V + final`` per row (accepted length and final token)."""
    return m * vocab + tokens.gather(1, m[:, None]).squeeze(1)


def tree_sampler(backend, pair: MarkovPair, parents: np.ndarray, *, length: int, seed: int, device=None):
    """``draw(b)``: decode the next ``b`` sequences of ``length`` tokens through ``backend.verify_tree``, one tree of
    shape ``parents`` per round, drafted as the backend's declared scheme requires (drafting generator seeded
    ``2 * seed``, on the CPU; the backend's ``2 * seed + 1``, on ``device`` with its inputs), the generators carried
    from call to call: consecutive draws add up to one run in chunks of those sizes."""
    scheme = tree_scheme_of(backend)
    draft_gen = torch.Generator().manual_seed(2 * seed)
    verify_gen = device_generator(2 * seed + 1, device)

    def round_fn(last: torch.Tensor, where: str):
        tokens, tree, qs, p = draw_markov_trees(scheme, parents, pair, last, draft_gen)
        m, _, out = verify_tree_rows(backend, tokens, tree, qs, p, generator=verify_gen, where=where, vocab=pair.vocab, device=device)
        return m + 1, out

    return rounds_sampler(pair, length=length, round_fn=round_fn, where=f"{pair.name} trees, seed {seed}")
