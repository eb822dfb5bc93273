"""Serving conditions as data: engine settings and prompts that put speculation where production breaks it, and the
evidence, read from the engine, that it got there.

Engine-neutral. A :class:`Condition` names its engine settings in the knobs of :data:`KNOBS` (an adapter maps each
to its engine's own setting, or refuses the condition with the knob it lacks: a row that says so), its cases
(:class:`conformance.engines.matrix.Case` records with ``condition`` set, several prompts each: their exact laws are
the tables', whatever the engine's KV layout) and its *evidence*: predicates over what the engine reports after the
condition's batches (:data:`EVIDENCE`: its prefix-cache hits, its preemptions, its largest step, its KV block size).
Where the engine also says per request whether it reached the condition (a request preempted, a prompt served
from the cache: ``preemptions`` / ``cached_tokens`` on its line), the evidence states how many of the case's requests
did. A case whose evidence does not hold is ``NOT REACHED``, a failure, never a pass: an engine that never preempted has
not been certified under preemption. The runner runs a condition's cases in their own worker (the settings apply to
one engine load), beside the engine's plain sampling cases; the exact law and the checks beside it are the same.
"""
from __future__ import annotations

import operator
import random
from dataclasses import dataclass, replace

from specdec_ref.warp import GREEDY, SamplingConfig

from .matrix import Case

__all__ = ["KNOBS", "EVIDENCE", "COUNTERS", "KNOB_EVIDENCE", "PER_REQUEST", "Condition", "CONDITIONS", "condition",
           "condition_cases", "under", "distinct_prompts", "evidence_check", "per_request_evidence", "random_prompt"]

#: Engine-neutral settings a condition may ask for. An adapter maps each to its engine (``open_condition``).
KNOBS = {
    "block_size": "KV cache block (page) size in tokens",
    "prefix_caching": "reuse of cached KV blocks across requests (True / False)",
    "token_budget": "tokens the engine schedules per step (prefills longer than it are chunked)",
    "kv_blocks": "KV blocks in the engine's pool (few: requests are preempted and recomputed)",
    "max_model_len": "positions a request may use (prompt + generated tokens)",
    "context_shift": "a request that fills its context has part of it discarded and goes on generating (True / False)",
    "draft_max_model_len": "positions the draft model can read, fewer than the target's (a draft with a shorter context)",
}

#: What an engine session may report after a condition's batch (``EngineSession.condition_counters``): counters are
#: summed over the batch (the worker takes the difference of two readings), settings are read back from the engine.
EVIDENCE = {
    "prefix_cache_hits": "prompt tokens served from the prefix cache (counter)",
    "preemptions": "requests preempted (their KV freed, recomputed later) (counter)",
    "token_budget": "the tokens the engine schedules per step, at most (setting, read back: a prompt longer than it is "
                    "prefilled in chunks by construction of the scheduler)",
    "block_size": "the KV block size the engine runs with (setting, read back)",
    "max_model_len": "the context limit the engine runs with (setting, read back)",
    "context_shifts": "contexts the engine shifted (part discarded, the rest moved back) (counter)",
    "draft_max_model_len": "the draft's context limit the engine runs with (setting, read back)",
}

#: The evidence that counts events (summed over a case's batches); the others are read as the engine states them.
COUNTERS = frozenset({"prefix_cache_hits", "preemptions", "context_shifts"})

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq}


def random_prompt(length: int, seed: int, family: str = "order2", marker: tuple[int, int] | None = None
                  ) -> tuple[int, ...]:
    """A deterministic prompt of ``length`` tokens for ``family``'s target: order2 and long start with ``<bos>`` (id 6)
    and continue with ids 0..5; order1 uses ids 0..6. ``marker = (position, index)``: the long family's marker
    ``m<index>`` (id 8 + index) at that position, the token the law reads wherever it stands."""
    rng = random.Random(f"condition-prompt-{family}-{length}-{seed}")
    if family in ("order2", "long"):
        out = [6] + [rng.randrange(6) for _ in range(length - 1)]
        if marker is not None:
            if family != "long":
                raise ValueError("only the long family has marker tokens")
            out[marker[0]] = 8 + marker[1]
        return tuple(out)
    return tuple(rng.randrange(7) for _ in range(length))


def distinct_prompts(count: int, seed: int, *, lengths: tuple[int, int] = (24, 100)) -> tuple[tuple[int, ...], ...]:
    """``count`` distinct order2 prompts: each shares a prefix of a random length with one base prompt (so an engine's
    prefix cache reuses it at every length, inside blocks too), continues at random, and ends in one of two table
    cells (``2, 3`` at an odd last position, ``4, 1`` at an even one), so that their completions have two laws
    (``Case.pooled``)."""
    rng = random.Random(f"distinct-prompts-{seed}")
    base = random_prompt(lengths[1], seed)
    out, seen = [], set()
    while len(out) < count:
        ending = ((2, 3), (4, 1))[len(out) % 2]
        n = rng.randrange(lengths[0] // 2, lengths[1] // 2) * 2 + len(out) % 2  # even length -> last position odd
        cut = rng.randrange(1, n - 2)
        p = base[:cut] + tuple(rng.randrange(6) for _ in range(n - 2 - cut)) + ending
        if p not in seen:
            seen.add(p)
            out.append(p)
    return tuple(out)


@dataclass(frozen=True)
class Condition:
    """One serving condition (see the module docstring). ``evidence``: ``(name, op, value)`` triples over
    :data:`EVIDENCE`; a value given as a string names a setting of the condition (``"block_size"``) or
    ``"longest_prompt"`` (the longest prompt of the case); ``guards``: the bug class and public reports it reaches."""

    name: str
    settings: dict
    evidence: tuple[tuple[str, str, object], ...]
    guards: str
    cases: tuple[Case, ...]

    def __post_init__(self):
        unknown = set(self.settings) - set(KNOBS)
        if unknown:
            raise ValueError(f"condition {self.name!r}: unknown knobs {sorted(unknown)}; known: {sorted(KNOBS)}")
        for name, op, _ in self.evidence:
            if name not in EVIDENCE or op not in _OPS:
                raise ValueError(f"condition {self.name!r}: evidence {name!r} {op!r}: unknown")
        for c in self.cases:
            if c.condition != self.name:
                raise ValueError(f"condition {self.name!r}: case {c.name!r} names condition {c.condition!r}")


def _case(cond: str, name: str, prompts, sampling: SamplingConfig, max_new_tokens: int, *, n: int, seed_base: int,
          exercises: str, eos: bool = True, seeded: bool = True, family: str = "order2", shifted: bool = False,
          pooled: bool = False, after: str | None = None) -> Case:
    prompts = tuple(tuple(p) for p in prompts)
    return Case(f"{cond}.{name}", family, prompts[0], sampling, max_new_tokens, eos, seeded, n, exercises, seed_base,
                condition=cond, extra_prompts=prompts[1:], shifted=shifted, pooled=pooled,
                after=None if after is None else f"{cond}.{after}")


_T1 = SamplingConfig(temperature=1.0)
#: Where the long pair's prefix-cache twins differ (their marker): in the last of the 2 048-token prompts' 16 blocks of
#: 128, so that an engine whose cache reuses any common prefix (llama.cpp) re-evaluates 88 tokens when the twins take
#: turns, not a quarter of the prompt.
LONG_MARKER_AT = 1960
#: The first turn of ``multi-turn``: a 59-token prompt and its greedy continuation of 6 tokens under order2-target (a
#: test checks it). The prompt and the first 5 tokens fill two blocks of 32, all computed in that turn; order2-draft's
#: argmax drafts, rebuilt, have a draft rejected at position 63 (its KV written for the draft, then rewritten when the
#: target's token there is the next round's input).
TURN1 = (59, 1102)
TURN1_GREEDY = (3, 3, 0, 0, 2, 3)
#: Requests per condition case (its prompts take turns): each prompt's law at reduced power (the tool states the TV it
#: detects per case) and the pooled transition test over every position.
NC = 6000


def _conditions() -> tuple[Condition, ...]:
    boundary = [random_prompt(n, n) for n in (29, 30, 31, 32)]
    shared = random_prompt(96, 0)
    cached = [shared + tail for tail in ((1,), (2, 3), (4, 0, 5))]
    long_prompts = [random_prompt(n, 100 + n) for n in (68, 100)]
    pressure = [random_prompt(n, 200 + n) for n in (60, 62)]
    edge = [random_prompt(120, 300 + i) for i in range(3)]
    shifted = [random_prompt(n, 400 + n, "order1") for n in (116, 120)]
    mixed = [random_prompt(n, 500 + n) for n in (8, 90)]
    # the long pair: a 2 048-token prompt whose marker m1 sits in its last block of 128 (tokens 1 920-2 047), and its
    # twin with m2 there instead; both share blocks 0-14, each is followed by tails of 1 and 3 tokens
    base = random_prompt(2048, 600, "long")
    twins = [base[:LONG_MARKER_AT] + (8 + index,) + base[LONG_MARKER_AT + 1:] for index in (1, 2)]
    long_cached = [twin + tail for twin in twins for tail in ((1,), (4, 0, 5))]
    turn1 = random_prompt(*TURN1)
    # three 4 088-token prompts that differ only in their last 3 tokens, the marker m0 at 2 000: 8 new tokens end each
    # request at position 4 096, the limit
    edge_base = random_prompt(4085, 800, "long", marker=(2000, 0))
    long_edge = [edge_base + tail for tail in ((1, 2, 3), (4, 0, 5), (2, 2, 1))]
    # prompts of 516 (= 4 x 128 + k + 1) and 600 tokens prefilled in chunks of 128, the marker in the first chunk of
    # one and in the third of the other: the last chunk and every decode read it across chunks
    chunked = [random_prompt(516, 700, "long", marker=(100, 1)), random_prompt(600, 701, "long", marker=(300, 3))]
    return (
        Condition("block-boundary", {"block_size": 32, "prefix_caching": False, "max_model_len": 128},
                  (("block_size", "==", "block_size"),),
                  "the first generated token and the k drafts after it cross a KV block boundary at every offset "
                  "(prompts of 29-32 tokens, blocks of 32): a draft or verify step that writes past the last slot of a "
                  "block, or reads the block table one entry short (vLLM #16370)",
                  (_case("block-boundary", "29-32", boundary, _T1, 4, n=NC, seed_base=2_000_000,
                         exercises="four prompts whose speculated positions cross block 32 at every offset"),)),
        Condition("prefix-cache", {"block_size": 32, "prefix_caching": True, "max_model_len": 128},
                  (("prefix_cache_hits", ">", 0), ("block_size", "==", "block_size")),
                  "prefix-cache hits restore the target's KV but not the draft's, or leave a prefill of 1-3 tokens "
                  "whose drafts are padded (SGLang #31600, #19897; vLLM #43559): a 96-token prefix (three full blocks) "
                  "shared by three prompts, each request after the first served from the cache",
                  (_case("prefix-cache", "97-99", cached, _T1, 4, n=NC, seed_base=2_100_000,
                         exercises="a cached 96-token prefix and tails of 1-3 tokens"),)),
        Condition("chunked-prefill", {"token_budget": 64, "block_size": 32, "prefix_caching": False,
                                      "max_model_len": 128},
                  (("token_budget", "<", "longest_prompt"),),
                  "prefills longer than the step's token budget, split into chunks, one with a last chunk of exactly "
                  "k + 1 tokens (68 = 64 + 4), interleaved with speculating decodes (vLLM #47123: a k + 1-token chunk "
                  "taken for a verify step)",
                  (_case("chunked-prefill", "68-100", long_prompts, _T1, 4, n=NC, seed_base=2_200_000,
                         exercises="seeded requests whose prefill is chunked by a budget of 64 tokens"),)),
        Condition("preemption", {"kv_blocks": 24, "block_size": 32, "prefix_caching": False, "max_model_len": 128},
                  (("preemptions", ">", 0),),
                  "requests preempted mid-speculation and recomputed (vLLM #49620, #40768: stale drafts after "
                  "resumption): 24 blocks of 32 for prompts of 60 and 62 tokens generating 12, so that running "
                  "requests outgrow the pool when they cross into their third block",
                  (_case("preemption", "60-62", pressure, _T1, 12, n=NC, seed_base=2_300_000,
                         exercises="requests that cross into a third block while the pool is full"),)),
        Condition("context-edge", {"block_size": 32, "prefix_caching": False, "max_model_len": 128},
                  (("max_model_len", "==", "max_model_len"),),
                  "requests that end at the context limit (prompt + max tokens = 128), whose drafts would need positions "
                  "past it (llama.cpp #10641; vLLM #57941: drafts past a limit)",
                  (_case("context-edge", "120", edge, _T1, 8, n=NC, seed_base=2_400_000, eos=False,
                         exercises="three prompts of 120 tokens generating 8, to the last position"),)),
        Condition("context-shift", {"context_shift": True, "max_model_len": 128, "prefix_caching": False},
                  (("context_shifts", ">", 0),),
                  "generation past a full context with context shift on: part of the context is discarded, the rest "
                  "moved back, the draft's context with it, while drafts are in flight (llama.cpp #21815: n-gram "
                  "drafts with --context-shift abort). Order-1 target: its law reads the last token only, so every "
                  "generated token keeps the chain's law across the shift (blind to positions after it)",
                  (_case("context-shift", "116-120", shifted, _T1, 16, n=NC // 4, seed_base=2_500_000, eos=False,
                         family="order1", shifted=True,
                         exercises="prompts of 116 and 120 tokens generating 16 in a 128-token context (the "
                                   "checkpoints' limit): shifted at the 8th or 12th generated token"),)),
        Condition("distinct-prompts", {"block_size": 32, "prefix_caching": True, "max_model_len": 128},
                  (("prefix_cache_hits", ">", 0), ("block_size", "==", "block_size")),
                  "a new prompt in every request, against the matrix's one prompt repeated: 6 600 distinct prompts of "
                  "24-99 tokens sharing a prefix of a random length with one base, so that the prefix cache serves "
                  "prefixes of every length (inside a block too: a slot or block reused past the common prefix, a "
                  "draft's cache not cut back to it) and nothing a request leaves behind (the previous prompt's KV, "
                  "the draft's, a proposer's memory) agrees with the next by accident; a repeated prompt inflates "
                  "acceptance through caches (llama.cpp #26100). The prompts end in two table cells, so their "
                  "completions pool into two full-law tests",
                  (_case("distinct-prompts", "24-99", distinct_prompts(NC + NC // 10, 900), _T1, 4, n=NC,
                         seed_base=2_900_000, pooled=True,  # more prompts than the planned looks' requests (6 422)
                         exercises="6 600 distinct prompts sharing prefixes of random lengths, one request each"),)),
        Condition("multi-turn", {"block_size": 32, "prefix_caching": True, "max_model_len": 128},
                  (("prefix_cache_hits", ">", 0), ("block_size", "==", "block_size")),
                  "a conversation's next turn served from the KV the previous turn wrote while speculating. The first "
                  "turn (greedy, 6 tokens) computes positions 0-63, two blocks of 32, with a draft rejected at 63 and "
                  "its KV rewritten; the second turn's prompt is the first's prompt and first 5 tokens and another "
                  "6th, so the engine computes only position 64 and reads 63 (the order-2 law's previous token) from "
                  "the first turn's KV: a rejected draft's KV left there, or a block cached before it was rewritten, "
                  "changes the law (TV 0.24 on average)",
                  (_case("multi-turn", "turn1", [turn1], GREEDY, len(TURN1_GREEDY), n=64, seed_base=3_000_000,
                         eos=False, exercises="the first turn: a 59-token prompt, greedy, 6 tokens to position 64"),
                   _case("multi-turn", "turn2", [turn1 + TURN1_GREEDY[:5] + (1,)], _T1, 4, n=NC,
                         seed_base=3_100_000, eos=False, after="turn1",
                         exercises="the second turn: the first turn's text to position 63 and another token, sent "
                                   "after the first turn's requests")),
                  ),
        Condition("long-prefix-cache", {"block_size": 128, "prefix_caching": True, "max_model_len": 4096},
                  (("prefix_cache_hits", ">", 0), ("block_size", "==", "block_size")),
                  "the long-context pair (4 096 positions, the law reads the marker token wherever it stands): prefix-"
                  "cache hits on 2 048-token prompts whose marker sits in a cached block, two prompts sharing 11 blocks "
                  "and differing in the 12th by their marker: a hit that restores a stale or another prompt's block, "
                  "the target's or the draft's, changes the law by TV 0.45 on average (SGLang #31600, #19897; vLLM "
                  "#43559)",
                  (_case("long-prefix-cache", "2049-2051", long_cached, _T1, 4, n=NC, seed_base=2_700_000,
                         family="long",
                         exercises="2 048-token prompts with the marker in a cached block, tails of 1 and 3 tokens"),)),
        Condition("long-chunked-prefill", {"token_budget": 128, "block_size": 128, "prefix_caching": False,
                                           "max_model_len": 4096},
                  (("token_budget", "<", "longest_prompt"),),
                  "the long-context pair's prompts of 516 and 600 tokens prefilled in chunks of 128, the marker in "
                  "an earlier chunk than the prompt's end: a chunk (or the draft's) that does not attend to the KV the "
                  "earlier chunks wrote loses the marker (TV 0.49 on average), which the order-2 law, reading only the "
                  "last two tokens, cannot see; the first prompt's last chunk is exactly k + 1 tokens (vLLM #47123)",
                  (_case("long-chunked-prefill", "516-600", chunked, _T1, 4, n=NC // 4, seed_base=2_800_000,
                         family="long",
                         exercises="seeded 516- and 600-token prompts prefilled in chunks of 128, the marker in the "
                                   "first or third chunk"),)),
        Condition("long-context-edge", {"block_size": 128, "prefix_caching": True, "max_model_len": 4096},
                  (("max_model_len", "==", "max_model_len"), ("prefix_cache_hits", ">", 0)),
                  "the long-context pair's requests that end at the context limit of 4 096 (prompts of 4 088 tokens, "
                  "8 new, served from the prefix cache but their last 3 tokens): drafts that would need positions past "
                  "the limit (llama.cpp #10641, #26478; vLLM #57941), at the long context where production meets them",
                  (_case("long-context-edge", "4088", long_edge, _T1, 8, n=NC // 4, seed_base=3_200_000, eos=False,
                         family="long",
                         exercises="three 4 088-token prompts generating 8, to the last position of 4 096"),)),
        Condition("short-draft", {"draft_max_model_len": 64, "max_model_len": 128, "block_size": 32,
                                  "prefix_caching": False},
                  (("draft_max_model_len", "==", "draft_max_model_len"),),
                  "a draft model with fewer positions (64) than its target (128), requests that fit it batched with "
                  "requests past it (vLLM #57941, #48894, #58080: past the draft's limit the whole batch's drafts "
                  "become token 0 and acceptance collapses engine-wide). The rounds of the requests that fit the draft "
                  "are rebuilt from the draft's law; the others have no draft law and are not compared",
                  (_case("short-draft", "8-90", mixed, _T1, 8, n=NC // 4, seed_base=2_600_000,
                         exercises="prompts of 8 and 90 tokens taking turns: every step mixes requests inside and past "
                                   "the draft's 64 positions"),)),
    )


CONDITIONS: tuple[Condition, ...] = _conditions()


def condition(name: str) -> Condition:
    for c in CONDITIONS:
        if c.name == name:
            return c
    raise KeyError(f"unknown condition {name!r}; known: {', '.join(c.name for c in CONDITIONS)}")


#: The counter that shows a knob at work: a configuration that turns the knob off under a condition must show none of it.
KNOB_EVIDENCE = {"prefix_caching": "prefix_cache_hits"}


def under(cond: Condition, overrides: dict) -> Condition:
    """``cond`` as a configuration runs it (its ``condition_settings``: e.g. the control with prefix caching off, the
    cold run the cached runs are compared with per seed): the settings overridden, and the evidence of a knob turned
    off inverted (``prefix_cache_hits > 0`` becomes ``== 0``: the cold run must show no hit)."""
    if not overrides:
        return cond
    unknown = sorted(set(overrides) - set(KNOBS))
    if unknown:
        raise ValueError(f"condition settings {unknown}: unknown knobs; known: {sorted(KNOBS)}")
    off = {KNOB_EVIDENCE[k] for k, v in overrides.items() if k in KNOB_EVIDENCE and not v}
    evidence = tuple((name, "==", 0) if name in off else (name, op, value) for name, op, value in cond.evidence)
    return replace(cond, settings={**cond.settings, **overrides}, evidence=evidence)


def condition_cases(names) -> tuple[Case, ...]:
    return tuple(case for n in names for case in condition(n).cases)


#: Per-request evidence an engine may put on a completion's line: the request was preempted, its prompt was served
#: (partly) from the prefix cache.
PER_REQUEST = {"preemptions": "preempted", "cached_tokens": "served from the prefix cache",
               "context_shifted": "had their context shifted"}


def per_request_evidence(lines) -> dict:
    """``{key: requests with key > 0}`` over a case's lines for the keys of :data:`PER_REQUEST` they carry, and
    ``requests``: how many lines."""
    lines = list(lines)
    out = {"requests": len(lines)}
    for key in PER_REQUEST:
        if lines and all(key in r for r in lines):
            out[key] = sum(1 for r in lines if int(r[key] or 0) > 0)
    return out


def evidence_check(cond: Condition, case: Case, observed: dict | None, per_request: dict | None = None,
                   absent: dict | None = None):
    """``(reached, text)``: whether every evidence predicate of ``cond`` holds on what the engine reported over the
    case's batches (``observed``; None: the engine reports nothing, so the condition is not shown reached); the text
    adds how many requests the engine says reached it (``per_request``: :func:`per_request_evidence`). ``absent``: the
    knobs the engine has no counterpart for (``EngineAdapter.absent_knobs``, knob -> why): a predicate on one of them
    is stated as not applicable and not required, but at least one predicate must hold."""
    if observed is None:
        return False, "the engine reports none of the evidence this condition needs: not shown reached"
    parts, ok, judged = [], True, 0
    for name, op, value in cond.evidence:
        if name in (absent or {}):
            parts.append(f"{name}: not applicable ({absent[name]})")
            continue
        judged += 1
        want = max(len(p) for p in case.prompts) if value == "longest_prompt" else (
            cond.settings[value] if isinstance(value, str) else value)
        got = observed.get(name)
        held = got is not None and _OPS[op](got, want)
        ok &= held
        parts.append(f"{name} {got} {op} {want}" + ("" if held else " FAILS" if got is not None else " (not reported)"))
    if not judged:
        ok = False
        parts.append("no evidence left that the engine can report: not shown reached")
    for key, what in PER_REQUEST.items():
        if (per_request or {}).get(key) is not None:
            parts.append(f"{per_request[key]} of {per_request['requests']} requests {what}")
    return ok, "; ".join(parts)
