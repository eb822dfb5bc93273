"""What a backend says each round drafted (``RoundRecord.drafts``, ``parents``, ``draft_probs``; capability
``round_drafts``: ``specdec_ref.contract.Decoder``, "Drafts in the round records"): whether it claims to say it, the
claim honoured by every record, and where two drafts first differ.

A backend that does not claim ``round_drafts`` is judged by its rounds' counts and acceptance only; the checks that
would have compared its drafts say so in a finding (:func:`drafts_not_reported`). One that claims it and leaves a
record without its drafts, or with another number of drafts than it proposed, fails there.
"""
from __future__ import annotations

__all__ = ["reports_drafts", "chain_drafts", "tree_drafts", "first_difference", "drafts_not_reported"]


def reports_drafts(backend) -> bool:
    """Whether the backend claims ``round_drafts``."""
    return backend.capabilities.has("round_drafts")


def drafts_not_reported(check_what: str) -> dict:
    """The finding a check records for a backend that does not claim ``round_drafts``."""
    return {"kind": "drafts_not_reported",
            "note": f"the backend does not claim round_drafts: {check_what} compared by counts and acceptance only"}


def _ints(value) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def chain_drafts(record, where: str) -> list[int]:
    """A chain round's reported drafts; fails when the ``round_drafts`` claim is not honoured (no list of ints, or
    another number than ``record.proposed``)."""
    __tracebackhide__ = True
    drafts = getattr(record, "drafts", None)
    assert _ints(drafts) and len(drafts) == record.proposed, (
        f"{where}: the backend claims round_drafts but round {record.round} reports drafts={drafts!r} with proposed="
        f"{record.proposed} (a list of exactly the proposed draft tokens is claimed)")
    return drafts


def tree_drafts(record, where: str) -> tuple[list[int], list[int], list[float] | None]:
    """A tree round's reported ``(tokens, parents, probabilities or None)``; fails when the ``round_drafts`` claim is
    not honoured (tokens and parents lists of ints of ``record.proposed`` entries, probabilities of as many or None)."""
    __tracebackhide__ = True
    tokens, parents = getattr(record, "drafts", None), getattr(record, "parents", None)
    probs = getattr(record, "draft_probs", None)
    assert _ints(tokens) and _ints(parents) and len(tokens) == len(parents) == record.proposed, (
        f"{where}: the backend claims round_drafts but round {record.round} reports drafts={tokens!r}, "
        f"parents={parents!r} with proposed={record.proposed} (every node's token and parent are claimed)")
    assert probs is None or (isinstance(probs, list) and len(probs) == len(tokens)), (
        f"{where}: round {record.round} reports draft_probs={probs!r} for {len(tokens)} nodes (one per node, or None)")
    return tokens, parents, probs


def first_difference(got, want) -> int | None:
    """The first index where the sequences differ (the shorter one's length when one is a prefix of the other), None
    when they are equal."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))
