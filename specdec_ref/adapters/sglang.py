"""SGLang's tree verification layout, and an adapter that certifies any kernel with SGLang's signature.

SGLang (EAGLE-2/3, MTP, standalone drafts) verifies a draft tree with two CUDA kernels of ``sgl-kernel``,
``tree_speculative_sampling_target_only`` (sampling) and ``verify_tree_greedy`` (greedy). Their pure-PyTorch ports,
the files they were written from and the algorithm are in :mod:`specdec_ref.adapters.sglang_kernels`; this module
re-exports them. The layout below was read from the same repository: tree links built by
``build_tree_kernel_efficient`` (``sgl-kernel/csrc/speculative/eagle_utils.cu``, ``build_tree_efficient``) and the
caller in ``python/sglang/srt/speculative/eagle_utils.py`` (later ``eagle_info.py``, ``EagleVerifyInput.verify``)
(https://github.com/sgl-project/sglang). This module is our own code written from those files.

SGLang's layout (``N = num_draft_tokens``, ``S = num_speculative_tokens``)
-----------------------------------------------------------------------
* ``candidates[bs, N]``: node ``0`` is the *root* (the last verified token, never judged), nodes ``1..N-1``
  the drafts.
* ``retrive_index[bs, N]``: a batch-global id per node (``b * N + j``, as ``build_tree_efficient`` writes);
  ``predicts`` and ``accept_index`` speak these ids.
* ``retrive_next_token[bs, N]``: a node's first child, ``retrive_next_sibling[bs, N]``: its next sibling,
  ``-1`` for none (left-child / right-sibling links). ``build_tree_efficient`` walks the nodes from the
  last to the first and prepends each to its parent's child list, so siblings are linked in increasing
  index order. A node it cannot attach is skipped ("WARNING: invalid eagle tree"): it keeps ``-1`` links and
  no node points at it. That is how padding looks here.
* ``target_probs[bs, N, V]``: row ``j`` is the target's distribution after node ``j``'s path (row 0: at the
  root). ``target_predict[bs, N]`` (greedy) is its argmax.
* Outputs: ``predicts[bs * N]`` (int32, indexed by ``retrive_index``): the token emitted after that node, for
  the root and every accepted node; ``accept_index[bs, S]`` (int32): the retrive ids of the root and the
  accepted nodes, ``-1`` after; ``accept_token_num[bs]`` (int32): the number of accepted drafts (root excluded).
  At most ``S - 1`` drafts are accepted (SGLang passes ``S = speculative_num_steps + 1``, the tree depth + 1).

Our layout (the tree verifier contract, :class:`specdec_ref.contract.TreeVerifier`) maps one to one: our node ``i`` is
SGLang's node ``i + 1``, ``target_probs`` rows already agree (row ``i + 1`` after node ``i``). :func:`to_sglang_layout`
and :func:`from_sglang_outputs` convert, :class:`SGLangTreeBackend` wraps any kernel pair with SGLang's signature
(default: the ports :data:`tree_speculative_sampling_target_only` and :data:`verify_tree_greedy`) behind our
``verify_tree``.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import torch

from .. import __version__
from ..contract import PAD_TOKEN, Capabilities
from .sglang_kernels import (  # re-exported: the ports, and the floor they apply
    THRESHOLD_ACC_FLOOR,
    TreeSpeculativeSamplingTargetOnly,
    VerifyTreeGreedy,
    tree_speculative_sampling_target_only,
    verify_tree_greedy,
)
from ..tree import TreeResult, validate_tree_inputs

__all__ = [
    "SGLangLayout",
    "SGLangOutputs",
    "to_sglang_layout",
    "from_sglang_layout",
    "empty_sglang_outputs",
    "from_sglang_outputs",
    "TreeSpeculativeSamplingTargetOnly",
    "VerifyTreeGreedy",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy",
    "SGLangTreeBackend",
    "sglang_port_backend",
    "sglang_lossy_backend",
    "LOSSY_THRESHOLDS",
    "THRESHOLD_ACC_FLOOR",
]

#: ``(threshold_single, threshold_acc)`` of :func:`sglang_lossy_backend`: ``--speculative-accept-threshold-single 0.5
#: --speculative-accept-threshold-acc 0.5``, a setting seen in public SGLang launch scripts (tree drafting with
#: ``--speculative-eagle-topk 10``); SGLang's defaults are ``(1.0, 1.0)`` (``server_args.py``).
LOSSY_THRESHOLDS = (0.5, 0.5)


# ----------------------------------------------------------------------------- layout


class SGLangLayout(NamedTuple):
    """SGLang's tree tensors for one batch (see the module docstring); ``N = n + 1`` (the root is node 0)."""

    candidates: torch.Tensor  # Long[B, N]
    retrive_index: torch.Tensor  # Long[B, N]
    retrive_next_token: torch.Tensor  # Long[B, N]
    retrive_next_sibling: torch.Tensor  # Long[B, N]
    target_probs: torch.Tensor | None  # Float32[B, N, V], contiguous
    num_speculative_tokens: int  # S: accept_index has S columns


class SGLangOutputs(NamedTuple):
    """The kernels' mutable outputs, as SGLang allocates them (int32; ``-1`` / ``0`` filled)."""

    predicts: torch.Tensor  # Int32[B * N]
    accept_index: torch.Tensor  # Int32[B, S]
    accept_token_num: torch.Tensor  # Int32[B]


def _check_tree(draft_tokens: torch.Tensor, parents: torch.Tensor) -> None:
    """ValueError for a ``(draft_tokens, parents)`` pair that is not a padded, topologically ordered forest."""
    for name, value in (("draft_tokens", draft_tokens), ("parents", parents)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in (torch.int64, torch.int32) or value.dim() != 2:
            raise ValueError(f"{name} must be an integer tensor of shape [B, n], got {value.dtype} {tuple(value.shape)}")
    if draft_tokens.shape != parents.shape or draft_tokens.shape[0] < 1 or draft_tokens.shape[1] < 1:
        raise ValueError(f"draft_tokens {tuple(draft_tokens.shape)} and parents {tuple(parents.shape)} must share a shape [B >= 1, n >= 1]")
    real = draft_tokens >= 0
    if bool((draft_tokens < PAD_TOKEN).any()):
        raise ValueError("draft_tokens must be token ids >= 0, or -1 for padding")
    if bool((real[:, 1:] & ~real[:, :-1]).any()) or not bool(real[:, 0].all()):
        raise ValueError("padding (draft_tokens == -1) must come last, after at least one real node per row")
    index = torch.arange(draft_tokens.shape[1], device=parents.device)
    if bool((real & ((parents < -1) | (parents >= index))).any()):
        raise ValueError("parents must be topologically ordered: -1 <= parents[b, i] < i")


def to_sglang_layout(
    draft_tokens: torch.Tensor,
    parents: torch.Tensor,
    target_probs: torch.Tensor | None,
    *,
    root_tokens: torch.Tensor | None = None,
    num_speculative_tokens: int | None = None,
    validate: bool = True,
) -> SGLangLayout:
    """Our tree (``draft_tokens[B, n]``, ``parents[B, n]``, ``target_probs[B, n+1, V]``) in SGLang's layout.

    Node ``i`` becomes SGLang node ``i + 1`` (node 0 is the root, carrying ``root_tokens[b]``, 0 when not
    given: no kernel reads it). ``retrive_index[b, j] = b * N + j``; ``retrive_next_token`` is a node's
    smallest-index child and ``retrive_next_sibling`` the next larger-index child of the same parent (the
    order ``build_tree_efficient`` produces, and our contract's "siblings in index order"). A padded node
    (token ``-1``) gets candidate 0 and ``-1`` links, and nothing links to it: unreachable, as SGLang leaves
    a node it cannot attach. ``target_probs`` is passed through as contiguous float32 (the kernels' dtype;
    ``None`` is allowed for greedy). ``num_speculative_tokens`` (``S``, the columns of ``accept_index``)
    defaults to ``n + 1``, enough for any path without a host sync (SGLang uses depth + 1; the walk stops at
    a leaf either way). Vectorised: no Python loop over nodes, no host sync unless ``validate``.
    """
    if validate:
        if target_probs is not None:
            validate_tree_inputs(draft_tokens, parents, None, target_probs)
        else:
            _check_tree(draft_tokens, parents)
    batch, n = draft_tokens.shape
    size = n + 1
    if num_speculative_tokens is None:
        num_speculative_tokens = size
    if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be an int >= 1, got {num_speculative_tokens!r}")
    device = draft_tokens.device
    tokens = draft_tokens.long()
    real = tokens >= 0
    # SGLang indices: node j = our i + 1; parent 0 = the root. Padded nodes get parent -2 (attached nowhere).
    sg_parent = torch.where(real, parents.long() + 1, torch.full_like(tokens, -2))
    sg_parent = torch.cat([torch.full((batch, 1), -2, dtype=torch.long, device=device), sg_parent], 1)  # root: no parent
    nodes = torch.arange(size, device=device)
    none = torch.full((), size, dtype=torch.long, device=device)
    # first child of P: the smallest j with parent P
    is_child = sg_parent[:, None, :] == nodes[None, :, None]  # [B, P, j]
    first = torch.where(is_child, nodes, none).amin(-1)
    # next sibling of j: the smallest j' > j with the same (real) parent
    same = (sg_parent[:, :, None] == sg_parent[:, None, :]) & (sg_parent[:, :, None] >= 0) & (nodes[None, None, :] > nodes[None, :, None])
    sibling = torch.where(same, nodes, none).amin(-1)
    next_token = torch.where(first == size, -1, first)
    next_sibling = torch.where(sibling == size, -1, sibling)
    if root_tokens is None:
        root = torch.zeros(batch, 1, dtype=torch.long, device=device)
    else:
        root = torch.as_tensor(root_tokens, device=device).long().reshape(batch, 1)
    candidates = torch.cat([root, tokens.clamp_min(0)], 1)
    retrive_index = (torch.arange(batch, device=device)[:, None] * size + nodes).contiguous()
    probs = None if target_probs is None else target_probs.to(torch.float32).contiguous()
    return SGLangLayout(candidates, retrive_index, next_token, next_sibling, probs, num_speculative_tokens)


def from_sglang_layout(
    candidates: torch.Tensor, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's links back to ``(draft_tokens[B, n], parents[B, n])`` (``n = N - 1``).

    A node is real when the links reach it from the root; an unreachable node comes back padded (token
    ``-1``, parent ``-1``). Sibling order is not represented in ``parents`` (ours is index order); a tree whose
    sibling chains are not increasing comes back with the same parents but would be tried in another order.
    """
    batch, size = candidates.shape
    device = candidates.device
    next_token = retrive_next_token.long()
    next_sibling = retrive_next_sibling.long()
    parent = torch.full((batch, size + 1), -2, dtype=torch.long, device=device)  # column `size`: a sink for -1 links
    parent[:, 0] = -1  # the root is reached; a reached node has parent >= -1
    src = torch.arange(size, device=device).expand(batch, size)
    for _ in range(size):  # each pass follows every link out of the nodes reached so far
        reached = parent[:, :size] >= -1
        child = torch.where(reached & (next_token >= 0), next_token.clamp(0, size - 1), size)
        parent = parent.scatter(1, child, torch.where(child < size, src, -2))
        reached = parent[:, :size] >= -1
        sib = torch.where(reached & (src > 0) & (next_sibling >= 0), next_sibling.clamp(0, size - 1), size)
        parent = parent.scatter(1, sib, torch.where(sib < size, parent[:, :size], -2))
    reached = parent[:, 1:size] >= 0
    tokens = torch.where(reached, candidates[:, 1:].long(), PAD_TOKEN)
    parents = torch.where(reached, parent[:, 1:size] - 1, -1)
    return tokens, parents


def empty_sglang_outputs(batch: int, num_draft_tokens: int, num_speculative_tokens: int, device=None) -> SGLangOutputs:
    """``predicts`` / ``accept_index`` filled with ``-1`` and ``accept_token_num`` with 0, int32 (SGLang's allocation)."""
    return SGLangOutputs(
        torch.full((batch * num_draft_tokens,), -1, dtype=torch.int32, device=device),
        torch.full((batch, num_speculative_tokens), -1, dtype=torch.int32, device=device),
        torch.zeros(batch, dtype=torch.int32, device=device),
    )


def from_sglang_outputs(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor, retrive_index: torch.Tensor
) -> TreeResult:
    """The kernels' outputs as our ``(num_accepted[B], path[B, n], tokens[B, n+1])``, ``n = N - 1``.

    ``num_accepted = accept_token_num``; ``path[b, j] = (local index of accept_index[b, j + 1]) - 1`` for
    ``j < m``; ``tokens[b, j] = predicts[accept_index[b, j]]`` for ``j <= m`` (the accepted tokens then the
    final one), ``-1`` after. Garbage from a buggy kernel stays visible: an ``accept_index`` that is no node of
    its row (or the root) gives path ``-1``, an id outside ``predicts`` gives token ``-1``; ``num_accepted`` is
    returned as the kernel wrote it. Vectorised, no host sync.
    """
    batch, size = retrive_index.shape
    n = size - 1
    columns = accept_index.shape[1]
    device = retrive_index.device
    m = accept_token_num.long().reshape(batch)
    ids = accept_index.long()
    match = ids[:, :, None] == retrive_index.long()[:, None, :]  # [B, S, N]
    local = torch.where(match.any(-1), match.long().argmax(-1), -1)  # [B, S]
    width = n + 1  # tokens and (with one column less) path
    if columns < width:
        pad = torch.full((batch, width - columns), -1, dtype=torch.long, device=device)
        local, ids = torch.cat([local, pad], 1), torch.cat([ids, pad], 1)
    local, ids = local[:, :width], ids[:, :width]
    positions = torch.arange(width, device=device)
    node = local[:, 1:]
    path = torch.where((positions[:n] < m[:, None]) & (node >= 1), node - 1, PAD_TOKEN)
    flat = predicts.long().reshape(-1)
    valid = (ids >= 0) & (ids < flat.numel())
    emitted = torch.where(valid, flat[ids.clamp(0, max(flat.numel() - 1, 0))], PAD_TOKEN)
    tokens = torch.where(positions <= m[:, None], emitted, PAD_TOKEN)
    return TreeResult(m, path, tokens)


# ----------------------------------------------------------------------------- the adapter


def _call_kernel(kernel: Callable, **kwargs) -> Any:
    """Call ``kernel`` with SGLang's keyword arguments, fitted to its signature: ``retrive_*`` becomes
    ``retrieve_*`` where the kernel spells it so (newer ``sgl_kernel``), and ``draft_probs`` is dropped where the
    kernel has no such parameter (newer ``sgl_kernel`` allocates the scratch itself). A kernel whose signature
    cannot be read (a C extension) or that takes ``**kwargs`` gets them as they are."""
    try:
        params = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return kernel(**kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kernel(**kwargs)
    fitted = {}
    for key, value in kwargs.items():
        if key in params:
            fitted[key] = value
        elif key.startswith("retrive_") and "retrieve_" + key[len("retrive_"):] in params:
            fitted["retrieve_" + key[len("retrive_"):]] = value
        elif key == "draft_probs":
            continue
        else:
            fitted[key] = value  # let the kernel raise its own TypeError
    return kernel(**fitted)


def _coins(shape, generator, device) -> torch.Tensor:
    """Uniform coins in ``(0, 1)`` as float32. SGLang draws ``torch.rand`` (``[0, 1)``); a coin of exactly 0
    (probability ``2**-24``) would pass ``coin <= prob_acc`` for a first child of target probability 0, so it
    is raised to the smallest positive float (a change of at most ``2**-24`` in total variation)."""
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32).clamp_min_(torch.finfo(torch.float32).tiny)


class SGLangTreeBackend:
    """Our ``verify_tree`` contract around any kernel pair with SGLang's signature (default: the ports).

    ``verify_tree`` validates the inputs (``validate=True``), converts them with :func:`to_sglang_layout`,
    allocates SGLang's outputs, calls the greedy kernel (``draft_probs is None``: ``target_predict`` =
    ``argmax`` of ``target_probs``) or the sampling kernel (coins ``uniform_samples[B, N]`` then
    ``uniform_samples_for_final_sampling[B]`` drawn from ``generator``; ``draft_probs`` a zero scratch buffer,
    as SGLang's caller passes; our ``draft_probs`` is not read: the scheme ignores it) with
    ``threshold_single`` / ``threshold_acc``, and maps the outputs back with :func:`from_sglang_outputs`.

    Declares ``tree_scheme="deterministic"`` at thresholds ``(1, 1)`` (the kernel's law is then sequential
    one-hot acceptance, :class:`~specdec_ref.tree.DeterministicTreeVerifier`) and ``"lossy"`` below. A kernel
    for CUDA tensors only needs ``devices=("cuda",)``; inputs always reach the kernels as float32.
    """

    name = "specdec_ref.adapters.sglang"
    version = __version__

    def __init__(
        self,
        sampling_kernel: Callable | None = None,
        greedy_kernel: Callable | None = None,
        threshold_single: float = 1.0,
        threshold_acc: float = 1.0,
        batched: bool = True,
        *,
        validate: bool = True,
        dtypes: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16"),
        devices: tuple[str, ...] = ("cpu", "cuda"),
        tree_scheme: str | None = None,
        name: str | None = None,
    ):
        for label, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{label} must be a number in [0, 1] (SGLang's launcher checks it), got {value!r}")
        if sampling_kernel is not None and not callable(sampling_kernel):
            raise ValueError(f"sampling_kernel must be callable, got {type(sampling_kernel).__name__}")
        if greedy_kernel is not None and not callable(greedy_kernel):
            raise ValueError(f"greedy_kernel must be callable, got {type(greedy_kernel).__name__}")
        self.sampling_kernel = sampling_kernel if sampling_kernel is not None else tree_speculative_sampling_target_only
        self.greedy_kernel = greedy_kernel if greedy_kernel is not None else verify_tree_greedy
        self.threshold_single = float(threshold_single)
        self.threshold_acc = float(threshold_acc)
        self.validate = validate
        exact = self.threshold_single == 1.0 and self.threshold_acc == 1.0
        declared = tree_scheme or ("deterministic" if exact else "lossy")
        self.capabilities = Capabilities(
            greedy=True,
            sampling=True,
            batched=bool(batched),
            tree=True,
            dtypes=tuple(dtypes),
            devices=tuple(devices),
            tree_scheme=declared,
            extra={
                "threshold_single": self.threshold_single,
                "threshold_acc": self.threshold_acc,
                "sampling_kernel": _describe(self.sampling_kernel),
                "greedy_kernel": _describe(self.greedy_kernel),
            },
        )
        if name is not None:
            self.name = name
        elif not exact:
            self.name = f"{type(self).name}[threshold_single={self.threshold_single:g}, threshold_acc={self.threshold_acc:g}]"

    # --- the conversion steps (overridable: an adapter bug is a one-method subclass)

    def to_layout(self, draft_tokens, parents, target_probs) -> SGLangLayout:
        return to_sglang_layout(draft_tokens, parents, target_probs, validate=False)

    def from_outputs(self, outputs: SGLangOutputs, layout: SGLangLayout) -> TreeResult:
        return from_sglang_outputs(outputs.predicts, outputs.accept_index, outputs.accept_token_num, layout.retrive_index)

    def verify_tree(self, draft_tokens, parents, draft_probs, target_probs, *, generator: torch.Generator | None = None) -> TreeResult:
        """The tree verifier contract (:class:`specdec_ref.contract.TreeVerifier`) through SGLang's kernels."""
        if self.validate:
            validate_tree_inputs(draft_tokens, parents, draft_probs, target_probs)
        layout = self.to_layout(draft_tokens, parents, target_probs)
        batch, size = layout.candidates.shape
        device = layout.candidates.device
        out = empty_sglang_outputs(batch, size, layout.num_speculative_tokens, device)
        common = dict(
            predicts=out.predicts,
            accept_index=out.accept_index,
            accept_token_num=out.accept_token_num,
            candidates=layout.candidates,
            retrive_index=layout.retrive_index,
            retrive_next_token=layout.retrive_next_token,
            retrive_next_sibling=layout.retrive_next_sibling,
        )
        if draft_probs is None:
            _call_kernel(self.greedy_kernel, **common, target_predict=layout.target_probs.argmax(-1))
        else:
            coins = _coins((batch, size), generator, device)
            final_coins = _coins((batch,), generator, device)
            _call_kernel(
                self.sampling_kernel,
                **common,
                uniform_samples=coins,
                uniform_samples_for_final_sampling=final_coins,
                target_probs=layout.target_probs,
                draft_probs=torch.zeros_like(layout.target_probs),
                threshold_single=self.threshold_single,
                threshold_acc=self.threshold_acc,
                deterministic=True,
            )
        return self.from_outputs(out, layout)


def _describe(kernel: Callable) -> str:
    kind = kernel if isinstance(kernel, type) or inspect.isfunction(kernel) else type(kernel)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kernel))}"


def sglang_port_backend() -> SGLangTreeBackend:
    """The pure-PyTorch ports at SGLang's default thresholds ``(1, 1)``: declared ``deterministic``."""
    return SGLangTreeBackend()


def sglang_lossy_backend() -> SGLangTreeBackend:
    """The ports at thresholds :data:`LOSSY_THRESHOLDS` ``(0.5, 0.5)``: declared ``lossy``."""
    threshold_single, threshold_acc = LOSSY_THRESHOLDS
    return SGLangTreeBackend(threshold_single=threshold_single, threshold_acc=threshold_acc)
