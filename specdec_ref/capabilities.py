"""A backend's declaration of what it supports (:class:`Capabilities`) and the names a requirement may use.

Part of the backend contract (:mod:`specdec_ref.contract`, which re-exports every name here; the flags and
declarations are described by :class:`~specdec_ref.contract.Backend`, the schemes by ``Verifier`` / ``TreeVerifier``,
the proposers by ``Decoder``). Invariant: a requirement is a capability flag or ``dtype:`` / ``device:`` /
``proposer:`` / ``tree_proposer:`` + a known name (:func:`check_requirement`), and :meth:`Capabilities.has` answers
exactly those.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CAPABILITY_FLAGS", "SCHEMES", "LOSSLESS_SCHEMES", "TREE_SCHEMES", "LOSSLESS_TREE_SCHEMES", "DTYPE_NAMES",
           "DEVICE_NAMES", "PROPOSER_NAMES", "TREE_PROPOSER_NAMES", "check_requirement", "Capabilities"]

#: Capability flags a backend may claim (see :class:`specdec_ref.contract.Backend`). Checks are marked with the
#: flags they need; an unknown flag name is an error at collection time.
CAPABILITY_FLAGS = (
    "verifier", "greedy", "sampling", "batched", "cache", "decoder", "top_k", "top_p", "tree", "tree_decoder", "row_generators",
    "batched_decoder", "min_p", "history_sampling", "phase_timings", "batched_tree_decoder", "round_drafts",
)

#: Verification schemes a backend may declare (``Capabilities.scheme``; see :class:`specdec_ref.contract.Verifier`).
SCHEMES = ("token", "one_hot_draft", "block", "lossy")
#: The schemes whose output must follow the target's law exactly.
LOSSLESS_SCHEMES = ("token", "one_hot_draft", "block")
#: Tree verification schemes (``Capabilities.tree_scheme``; see :class:`specdec_ref.contract.TreeVerifier`).
TREE_SCHEMES = ("specinfer", "recursive", "deterministic", "lossy")
#: The tree schemes whose output must follow the target's law exactly.
LOSSLESS_TREE_SCHEMES = ("specinfer", "recursive", "deterministic")

DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
DEVICE_NAMES = ("cpu", "cuda")
#: Proposer kinds a decoder may accept as its ``draft`` (``Capabilities.proposers``; :mod:`specdec_ref.proposers`).
PROPOSER_NAMES = ("draft_model", "ngram", "eagle", "eagle3", "medusa", "mtp")
#: Proposer kinds a tree decoder may accept as its ``draft`` (``Capabilities.tree_proposers``): a draft model grows the
#: tree from its own rows, Medusa heads from one row per level, EAGLE / EAGLE-3 / MTP heads from one row per expanded
#: node (EAGLE-2's dynamic trees; :mod:`specdec_ref.tree_heads`).
TREE_PROPOSER_NAMES = ("draft_model", "medusa", "eagle", "eagle3", "mtp")


def check_requirement(flag: str) -> None:
    """Raise ValueError for a requirement that is neither a capability flag nor ``dtype:`` / ``device:`` /
    ``proposer:`` / ``tree_proposer:`` + a known name."""
    kind, sep, name = flag.partition(":")
    if (flag in CAPABILITY_FLAGS or (kind == "dtype" and name in DTYPE_NAMES) or (kind == "device" and name in DEVICE_NAMES)
            or (kind == "proposer" and name in PROPOSER_NAMES) or (kind == "tree_proposer" and name in TREE_PROPOSER_NAMES)):
        return
    raise ValueError(
        f"unknown capability {flag!r}; known: {', '.join(CAPABILITY_FLAGS)}, "
        f"dtype:{{{','.join(DTYPE_NAMES)}}}, device:{{{','.join(DEVICE_NAMES)}}}, proposer:{{{','.join(PROPOSER_NAMES)}}}, "
        f"tree_proposer:{{{','.join(TREE_PROPOSER_NAMES)}}}"
    )


@dataclass(frozen=True)
class Capabilities:
    """A backend's frozen declaration of what it supports; every flag defaults to ``False``.

    The flags, ``dtypes`` and ``devices`` are described in :class:`specdec_ref.contract.Backend`. A check that
    needs an unclaimed capability is skipped, naming it; a claimed capability must pass every
    check that needs it.
    """

    verifier: bool = False
    greedy: bool = False
    sampling: bool = False
    batched: bool = False
    cache: bool = False
    decoder: bool = False
    top_k: bool = False
    top_p: bool = False
    tree: bool = False
    tree_decoder: bool = False
    row_generators: bool = False
    batched_decoder: bool = False
    min_p: bool = False
    history_sampling: bool = False
    phase_timings: bool = False
    batched_tree_decoder: bool = False
    round_drafts: bool = False
    dtypes: tuple[str, ...] = ("float32",)
    devices: tuple[str, ...] = ("cpu",)
    proposers: tuple[str, ...] = ("draft_model",)
    tree_proposers: tuple[str, ...] = ("draft_model",)
    batched_tree_proposers: tuple[str, ...] = ("draft_model",)
    scheme: str = "token"
    bonus: bool = True
    tree_scheme: str = "specinfer"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown verification scheme {self.scheme!r}; known: {', '.join(SCHEMES)}")
        if self.tree_scheme not in TREE_SCHEMES:
            raise ValueError(f"unknown tree scheme {self.tree_scheme!r}; known: {', '.join(TREE_SCHEMES)}")
        if not isinstance(self.bonus, bool):
            raise ValueError(f"bonus must be a bool, got {self.bonus!r}")
        unknown = [p for p in self.proposers if p not in PROPOSER_NAMES]
        if unknown:
            raise ValueError(f"unknown proposer(s) {unknown}; known: {', '.join(PROPOSER_NAMES)}")
        unknown = [p for p in self.tree_proposers if p not in TREE_PROPOSER_NAMES]
        if unknown:
            raise ValueError(f"unknown tree proposer(s) {unknown}; known: {', '.join(TREE_PROPOSER_NAMES)}")
        unknown = [p for p in self.batched_tree_proposers if p not in self.tree_proposers]
        if unknown and self.batched_tree_decoder:
            raise ValueError(f"batched_tree_proposers {unknown} are not among the tree_proposers {self.tree_proposers}")

    @property
    def lossless(self) -> bool:
        """Whether the declared scheme claims the target's exact law."""
        return self.scheme in LOSSLESS_SCHEMES

    @property
    def tree_lossless(self) -> bool:
        """Whether the declared tree scheme claims the target's exact law."""
        return self.tree_scheme in LOSSLESS_TREE_SCHEMES

    def scheme_label(self) -> str:
        """``"token"``, ``"block, no bonus"``, ...: the declared scheme in words."""
        return self.scheme + ("" if self.bonus else ", no bonus")

    def has(self, flag: str) -> bool:
        """A capability flag, or ``dtype:NAME`` / ``device:NAME`` (claimed in ``dtypes`` / ``devices``)."""
        check_requirement(flag)
        kind, _, name = flag.partition(":")
        if kind == "dtype" and name:
            return name in self.dtypes
        if kind == "device" and name:
            return name in self.devices
        if kind == "proposer" and name:
            return name in self.proposers
        if kind == "tree_proposer" and name:
            return name in self.tree_proposers
        return bool(getattr(self, flag))

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d
