"""Known-failure lists (``--specdec-xfails=FILE``): exact ids, never prefixes.

One entry per line, ``<id> <reason...>``; blank lines and ``#`` comments are ignored. ``<id>``
is either a check id (``sampling_accepted_length_law``: every case of that check) or a check id,
``-`` and a case id (``sampling_accepted_length_law-edges``: that case only). Nothing else
matches: ``sampling_accept`` marks no check, because no check is called that. Listed cases are
strict expected failures: one that passes fails the run.

An id that names no registered check or case is an error under the ``ci`` and ``thorough``
profiles (a stale list must not silently certify) and a warning under ``dev``.
"""
from __future__ import annotations

from .registry import CheckCase, all_cases


class XfailsError(ValueError):
    """A malformed line, or (under a strict profile) an id that names nothing."""


def parse_xfails(text: str, source: str = "xfails file") -> list[tuple[str, str]]:
    """``[(id, reason)]``; ``XfailsError`` naming the line number of a line without a reason."""
    entries = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) < 2 or not parts[1].strip():
            raise XfailsError(f"{source}:{lineno}: expected '<check id>[-<case id>] <reason>', got {raw!r}")
        entries.append((parts[0], parts[1].strip()))
    return entries


def matches(line_id: str, case: CheckCase) -> bool:
    """Whether an xfails id names ``case``: its check id exactly, or its full test id exactly."""
    return line_id == case.check.name or line_id == case.id


def unknown_ids(entries: list[tuple[str, str]]) -> list[str]:
    """The listed ids that name no registered check or case."""
    cases = all_cases()
    return [line_id for line_id, _ in entries if not any(matches(line_id, c) for c in cases)]


def reason_for(entries: list[tuple[str, str]], case: CheckCase) -> str | None:
    """The reason of the first line naming ``case``, or None."""
    return next((reason for line_id, reason in entries if matches(line_id, case)), None)
