"""The checks of request features beside a case's law: the log-probabilities an engine returns, the n > 1
completions of one request, the texts it returns (stop strings, streaming) and a streamed case against its
non-streamed twin; and the grammar text engines are given for a constraint.

Engine-neutral, called by the runner on each case's file after its law's verdict. A wrong log-probability makes the
case NOT CERTIFIED whatever its law (:mod:`conformance.engines.logprobs` states the rule), as does a streamed seed that
differs from its twin where seeds are honoured; the n > 1 note and the text patterns are descriptive and name the
explanation of a failed verdict (copies, text held back).
"""
from __future__ import annotations

import json
from pathlib import Path

from .verdict import CaseVerdict, Check, Level

__all__ = ["apply_logprobs_check", "apply_text_checks", "copies_note", "twin_check", "text_note", "grammar_text"]


def grammar_text(automaton, eos_id: int, prefix: str = "") -> str:
    """A token automaton (:class:`specdec_ref.automaton.TokenAutomaton` over the exactly-known vocabulary, token ``i``
    written ``<prefix>t<i>`` as the engine's grammar matcher sees its vocabulary: ``t<i>`` in vLLM and llama.cpp,
    `` t<i>`` in OpenVINO GenAI's tokenizer IR) as a GBNF grammar (llama.cpp's format, and xgrammar's EBNF): one rule
    per state, one alternative per allowed token, and the empty alternative where EOS is allowed (the engines allow
    end-of-generation only where the grammar may end)."""
    if '"' in prefix or "\\" in prefix:
        raise ValueError(f"grammar_text: a token prefix is written inside a quoted literal, {prefix!r} cannot be")
    rules = ["root ::= s%d" % automaton.start]
    for state, row in enumerate(automaton.transitions):
        alts = [f'"{prefix}t{v}" s{nxt}' for v, nxt in enumerate(row) if nxt >= 0 and v != eos_id]
        if 0 <= eos_id < len(row) and row[eos_id] >= 0:
            alts.append('""')
        rules.append(f"s{state} ::= " + " | ".join(alts))
    return "\n".join(rules) + "\n"


#: How a returned text departs from its tokens' rendering (:meth:`specdec_properties.stops.StopStrings.departure`), named where
#: one pattern explains every departure.
TEXT_PATTERNS = {
    "held_back": "the text of the last token(s), the start of a stop string, is missing: held back in case the stop "
                 "string completes, and never sent when generation ended otherwise",
    "not_cut": "the stop string is not cut from the text",
    "past_end": "the text runs past the stop string",
    "missing_end": "the end of the text is missing",
}


def text_note(case, path: Path) -> Check | None:
    """For a case that asks for the text: how many returned texts differ from their tokens' rendering, by pattern
    (:data:`TEXT_PATTERNS`), with the first example and the finish reasons; None when every text is right. The
    verdict is the black-box tool's (a wrong text is an invariant violation); this names the departure."""
    stop = case.stop_rule()
    counts: dict[str, int] = {}
    first: dict[str, dict] = {}
    finishes: dict[str, dict] = {}
    total = 0
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("text") is None:
            continue
        total += 1
        kind = stop.departure(r["completion_ids"], r["text"])
        if kind is None:
            continue
        counts[kind] = counts.get(kind, 0) + 1
        first.setdefault(kind, {"seed": r.get("seed"), "tokens": r["completion_ids"], "text": r["text"],
                                "rendered": stop.returned_text(r["completion_ids"]), "finish_reason": r.get("finish_reason")})
        f = finishes.setdefault(kind, {})
        f[str(r.get("finish_reason"))] = f.get(str(r.get("finish_reason")), 0) + 1
    if not counts:
        return None
    parts = []
    for kind, k in sorted(counts.items(), key=lambda kv: -kv[1]):
        ex = first[kind]
        why = TEXT_PATTERNS.get(kind, "another difference")
        parts.append(f"{k} of {total} texts: {why} (finish_reason {finishes[kind]}; first: seed {ex['seed']}, tokens "
                     f"{ex['tokens']}, text {ex['text']!r}, rendered {ex['rendered']!r})")
    return Check(False, "; ".join(parts), {"texts": total, "patterns": counts,
                                           "explains": len(counts) == 1 and "other" not in counts})

def twin_check(case, path: Path, twin_path: Path) -> Check:
    """A case that repeats another's requests seed for seed (``case.same_seeds_as``; a streamed case and its
    non-streamed twin) on an engine whose seeds are per request: every seed both files hold must give the same token
    ids and the same text. A departure names the first seed, both completions and texts, and how many differ."""
    def by_seed(p: Path) -> dict:
        out = {}
        for line in p.read_text().splitlines():
            r = json.loads(line)
            out[(r.get("seed"), r.get("index"))] = (list(r["completion_ids"]), r.get("text"))
        return out

    mine, theirs = by_seed(path), by_seed(twin_path)
    common = sorted(k for k in set(mine) & set(theirs) if k[0] is not None)
    if not common:
        return Check(None, f"no seed shared with {case.same_seeds_as}: not compared")
    differing = [k for k in common if mine[k] != theirs[k]]
    detail = {"twin": case.same_seeds_as, "compared": len(common), "differing": len(differing)}
    if not differing:
        return Check(True, f"per seed identical to {case.same_seeds_as}: {len(common)} of {len(common)} seeds, token "
                           "ids and text", detail)
    k = differing[0]
    (a, ta), (b, tb) = mine[k], theirs[k]
    return Check(False, f"{len(differing)} of {len(common)} seeds differ from {case.same_seeds_as} (first: seed "
                        f"{k[0]}: {a} {ta!r} here, {b} {tb!r} there)", detail)


def copies_note(case, path: Path) -> Check:
    """For a case with n > 1 completions per request: in how many requests all n are the same completion, against the
    share the exact law gives independent completions (``sum_x P(x)^n``). Descriptive (``passed`` None): the verdict
    is the law's; where the law failed and copies are several times too frequent, the runner names them as the
    departure's explanation."""
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model

    groups: dict = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        groups.setdefault((r.get("seed"), tuple(r["prompt_ids"])), []).append(tuple(r["completion_ids"]))
    full = [g for g in groups.values() if len(g) == case.samples]
    same = sum(1 for g in full if len(set(g)) == 1)
    em = exact_model(case.model)
    law = continuation_law(em, list(case.prompt), case.max_new_tokens, case.sampling,
                           eos_id=int(em.eos_id) if case.eos else None)
    share = sum(float(p) ** case.samples for p in law.values())
    expected = share * len(full)
    text = (f"all {case.samples} completions the same in {same} of {len(full)} requests (independent completions: "
            f"{expected:.1f} expected, share {share:.4f})")
    explain = same > 3 * expected + 10  # several times the independent share: the completions share their randomness
    if explain:
        text = f"a request's {case.samples} completions are copies of one another: " + text
    return Check(None, text, {"requests": len(full), "identical": same, "expected": expected, "copies_explain": explain})


def apply_logprobs_check(ad, cfg, case, info: dict, c: CaseVerdict) -> None:
    """The case's returned log-probabilities against the exact values (:mod:`.logprobs`), under the convention the
    adapter declares for the configuration; a wrong one makes the case NOT CERTIFIED, the law's own level kept as
    ``law_level``."""
    from .logprobs import logprob_check

    convention = ad.logprobs_of(cfg)
    if convention is None:
        c.logprobs = Check(None, f"{ad.title}'s adapter declares no log-probability convention: not checked")
        return
    try:
        lines = map(json.loads, (Path(info["dir"]) / info["file"]).read_text().splitlines())
        c.logprobs = logprob_check(case, lines, convention, top=ad.conventions.logprobs_top)
    except Exception as exc:  # noqa: BLE001 - our tooling failed on this case: named, never the runner's crash
        c.law_level, c.level = c.level, Level.TOOL_ERROR
        c.headline = f"TOOL ERROR: logprobs check: {type(exc).__name__}: {exc}"[:300]
        return
    if c.logprobs is not None and c.logprobs.passed is False:
        c.law_level, c.level = c.level, Level.NOT_CERTIFIED
        c.headline = f"NOT CERTIFIED: {c.logprobs.detail['summary']}; the law alone: {c.headline}"[:300]


def apply_text_checks(ad, case, state: dict, c: CaseVerdict) -> None:
    """A case that asks for the text: its texts by pattern (:func:`text_note`; one pattern that explains every wrong
    text is the verdict's explanation) and, for a case repeating another's seeds on an engine whose seeds are per
    request, the per-seed comparison (:func:`twin_check`), which makes a law that passed NOT CERTIFIED. Where the seed
    probe of either case shows seeds not honoured, a differing seed is no evidence against the stream: not judged."""
    from .seeds import seed_check

    info = state["cases"][case.name]
    path = Path(info["dir"]) / info["file"]
    twin = state["cases"].get(case.same_seeds_as or "", {})
    if case.same_seeds_as and ad.conventions.seeds == "per_request" and twin.get("file"):
        c.twin = twin_check(case, path, Path(twin["dir"]) / twin["file"])
        probes = [p for p in (info.get("seed_probe"), twin.get("seed_probe")) if p and "error" not in p]
        if c.twin.passed is False and any(seed_check(p).passed is False for p in probes):
            c.twin = Check(None, f"not judged: the seed probe shows seeds not honoured in this configuration, so a seed "
                                 f"need not repeat its completion ({c.twin.text})", c.twin.detail)
        if c.twin.passed is False and c.level in (Level.CERTIFIED, Level.REDUCED):
            c.law_level, c.level = c.level, Level.NOT_CERTIFIED
            c.headline = f"NOT CERTIFIED: {c.twin.text}; the law alone: {c.headline}"[:300]
    c.text = text_note(case, path)
    if c.text is not None and c.text.detail.get("explains") and c.level is Level.NOT_CERTIFIED:
        c.explained = c.text.text
