"""The per-request seed probe: an engine that declares ``per_request`` seeds must give a seeded request the same
completion whatever else is in its batch.

The worker generates each case's batch as usual; then it generates again the first :data:`PROBE_N` seeded requests
of every case in that batch, in reverse order and beside :data:`PROBE_FILLERS` unseeded requests of the same cases
(another batch composition, and other draws from any global generator). Each probed request must give the same
completion, token for token. A departure names the first seed and position that differ and how many of the probed
requests differ.

The bug class: a sampling step that draws from a global or per-batch generator instead of the request's own, so that
a seeded request's output depends on its neighbours and on the requests before it. The law of the outputs stays
exact, so no distribution test can see it. In speculative decoding the drafts are the usual place: a draft sampled
from the global generator changes the emitted tokens through the verifier's coupling, even when the verifier draws
from the request's generator. Found in vLLM 0.32.0 with ``draft_sample_method="probabilistic"``
(docs/vllm-verdict.md, defect D).

Also here, :func:`identity_check`: a configuration that claims to equal another per seed (``identical_to``) compared
request by request (each of a request's ``n`` completions by its index), naming the first that differs.
"""
from __future__ import annotations

from dataclasses import replace

__all__ = ["PROBE_N", "PROBE_FILLERS", "probe_requests", "compare", "seed_check", "identity_check"]

#: Seeded requests per case generated a second time.
PROBE_N = 32
#: Unseeded requests beside them in the probe's batch.
PROBE_FILLERS = 32


def probe_requests(items) -> tuple[list, list[int]]:
    """``(the probe batch, the indices in items of its probed requests)``: per case the first :data:`PROBE_N` seeded
    requests of ``items`` (the case's batch, in its order), all of them reversed, then :data:`PROBE_FILLERS` unseeded
    copies of requests of those cases."""
    picked, per_case = [], {}
    for i, r in enumerate(items):
        if r.seed is not None and per_case.get(r.case, 0) < PROBE_N:
            per_case[r.case] = per_case.get(r.case, 0) + 1
            picked.append(i)
    picked.reverse()
    if not picked:
        return [], []
    fillers = [replace(items[picked[j % len(picked)]], seed=None) for j in range(PROBE_FILLERS)]
    return [items[i] for i in picked] + fillers, picked


def compare(case: str, items, outs, probe_outs, picked) -> dict | None:
    """The probe's record for ``case``: ``{compared, differing, first}`` (``first``: seed, 1-based position, both
    completions), or None when the case had no seeded request in the probe."""
    pairs = [(items[i].seed, _ids(outs[i]), _ids(again)) for i, again in zip(picked, probe_outs) if items[i].case == case]
    if not pairs:
        return None
    differing = [(seed, a, b) for seed, a, b in pairs if list(a) != list(b)]
    out = {"compared": len(pairs), "differing": len(differing)}
    if differing:
        seed, a, b = differing[0]
        pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        out["first"] = {"seed": seed, "position": pos + 1, "batch": [int(t) for t in a], "again": [int(t) for t in b]}
    return out


def _ids(out: dict) -> list[int]:
    """A request's completion, or its n completions one after the other (a request asking for n > 1)."""
    if "samples" in out:
        return [int(t) for s in out["samples"] for t in s["completion_ids"]]
    return [int(t) for t in out["completion_ids"]]


def seed_check(probe: dict | None):
    """The runner's check of a case's probe record (a :class:`conformance.engines.verdict.Check`), None without one."""
    from .verdict import Check

    if not probe:
        return None
    if not probe["differing"]:
        return Check(True, f"every one of {probe['compared']} seeded requests gave the same completion in another batch",
                     {"compared": probe["compared"]})
    f = probe["first"]
    return Check(False, f"SEEDS NOT HONOURED: {probe['differing']} of {probe['compared']} seeded requests gave another "
                        f"completion when generated again in another batch (first: seed {f['seed']}, position "
                        f"{f['position']}: {f['batch']} vs {f['again']})",
                 {"compared": probe["compared"], "differing": probe["differing"]})


def identity_check(case, mine: dict, other: dict, other_name: str):
    """Per-seed identity with ``other_name``'s outputs of the same case: request by request (matched by seed),
    the first request and position that differ."""
    import json
    from pathlib import Path

    from .verdict import Check

    a, b = mine["cases"].get(case.name, {}), other["cases"].get(case.name, {})
    if not case.seeded or a.get("status") != "ok" or b.get("status") != "ok":
        return None
    load = lambda info: {(r["seed"], r.get("index")): r  # noqa: E731 - a request's n completions by their index
                         for r in map(json.loads, (Path(info["dir"]) / info["file"]).read_text().splitlines())}
    ra, rb = load(a), load(b)
    common = sorted(set(ra) & set(rb), key=lambda key: (key[0], -1 if key[1] is None else key[1]))
    unit = "requests" if all(key[1] is None for key in common) else "completions"  # n > 1: each of a request's n
    for key in common:
        x, y = ra[key]["completion_ids"], rb[key]["completion_ids"]
        if x != y:
            pos = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            differing = sum(ra[s]["completion_ids"] != rb[s]["completion_ids"] for s in common)
            where = f"request seed {key[0]}" + (f" completion {key[1]}" if key[1] is not None else "")
            return Check(False, f"differs from {other_name} at {where}, position {pos + 1}: {x} vs {y} "
                                f"({differing} of {len(common)} {unit} differ)",
                         {"compared": len(common), "differing": differing})
    return Check(bool(common), f"identical to {other_name} on all {len(common)} {unit}" if common else
                 "no common seeds", {"compared": len(common)})
