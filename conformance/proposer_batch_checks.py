"""Batch invariance of decoders drafting with proposers other than a draft model (capabilities ``batched_decoder`` and
``proposer:NAME``; run with the batch checks, conformance/test_batch.py).

The batched decoder contract's invariance holds whatever drafts: a seeded request decodes bit for bit the same alone and
in any batch, and a row's drafts depend on its own text, settings and generator only (``specdec_ref.contract``:
``BatchedDecoder.decode_batch`` and ``Decoder``, "Proposers"). A proposer keeps per-row state the draft model's cache
does not: prompt lookup's texts, a head's backlog of committed tokens and target features (padded to the longest row in
the catch-up), rows with no feature yet (a one-token prompt's first round drafts nothing while its neighbours draft).
Bugs there (a row reading another row's text or feature after rows leave, the padding's feature, a neighbour's draws)
change a seeded row's drafts only in a batch, so its acceptance and, sampled, its output: the exactness checks cannot
see them (the law holds whatever is drafted), the acceptance check only as a total. Here each seeded row is decoded in a
batch of ragged neighbours, alone and in another batch, and compared round by round.
"""
from __future__ import annotations

from specdec_ref.contract import Request
from specdec_ref.warp import GREEDY, SamplingConfig

from .check_helpers import decode_batch, row_dependence_note
from .draft_records import chain_drafts, reports_drafts
from .proposer_checks import GREEDY_PROMPTS, PROPOSER_K, _require, proposer_spec, proposer_target
from .registry import CheckContext, check

#: These checks run with the batch checks (conformance/test_batch.py).
FAMILY = "batch"
#: The proposers and their drafts: sampled from the head's law where it samples, else argmax (prompt lookup: one-hot).
CASES = (("ngram", False), ("eagle", True), ("eagle", False), ("eagle3", False), ("mtp", True), ("medusa", False))
#: The requests: the greedy prompts (1 to 8 tokens, some repetitive so that lookups match), budgets that end rows at
#: different rounds, EOS on every other row; seeded rows at this temperature, one greedy and one unseeded neighbour.
BATCH_SAMPLING = SamplingConfig(temperature=1.0)
BUDGETS = (16, 7, 12, 5, 14, 9, 16, 6, 11, 10)
EOS = 7


def _requests(seed: int) -> list[Request]:
    reqs = []
    for i, (prompt, budget) in enumerate(zip(GREEDY_PROMPTS, BUDGETS)):
        greedy, unseeded = i == 3, i == 6
        reqs.append(Request(prompt=list(prompt), max_new_tokens=budget, sampling=GREEDY if greedy else BATCH_SAMPLING,
                            eos_ids=EOS if i % 2 else None, seed=None if unseeded else seed + i))
    return reqs


def _rounds(result, drafts: bool, where: str) -> list[tuple]:
    """What a row's rounds did: (start, proposed, accepted, emitted[, drafts])."""
    return [(r.start, r.proposed, r.accepted, r.emitted) + ((tuple(chain_drafts(r, where)),) if drafts else ())
            for r in result.rounds]


@check(
    guards="proposer state mixed between rows: a row looking up another row's text or reading another row's (or the "
    "padding's) feature after rows leave or in the catch-up, a neighbour's draws or drafts, a one-token prompt's first "
    "round drafting from its neighbours' state (acceptance and seeded outputs that depend on the batch; the law exact)",
    requires=("batched_decoder", "sampling"),
    cases=[(f"{kind}-{'sampled' if sample else 'one_hot'}", {"kind": kind, "sample": sample}) for kind, sample in CASES],
)
def check_batch_proposer_seeded_rows_reproduce_alone(backend, ctx: CheckContext, kind: str, sample: bool):
    """Every seeded request with the proposer ``kind`` (k = 3) decodes bit for bit the same in a batch of ten ragged
    requests (prompts of 1 to 8 tokens, budgets of 5 to 16, EOS on every other row, a greedy and an unseeded
    neighbour), alone, and in the reversed batch: its tokens, and every round's start, proposed and accepted counts
    (with ``round_drafts`` claimed, its drafts too); the greedy row too. The first round that differs is named."""
    _require(backend, kind)
    target, spec = proposer_target(kind), proposer_spec(kind, sample)
    requests = _requests(ctx.seed_for("batch-proposer", kind, sample))
    drafts = reports_drafts(backend)
    label = f"{kind} proposer ({'sampled' if sample else 'argmax'} drafts), k={PROPOSER_K}"
    batch = decode_batch(backend, target, spec, requests, k=PROPOSER_K, where=f"{label}, batch of {len(requests)}")
    reversed_batch = decode_batch(backend, target, spec, requests[::-1], k=PROPOSER_K, where=f"{label}, reversed batch")
    for i, req in enumerate(requests):
        if req.seed is None and not req.sampling.greedy:
            continue
        where = (f"{label}, request {i} (prompt {req.prompt}, seed {req.seed}, {req.sampling.label()}, eos {req.eos_ids}, "
                 f"max_new_tokens {req.max_new_tokens})")
        alone = decode_batch(backend, target, spec, [req], k=PROPOSER_K, where=f"{label}, request {i} alone")[0]
        runs = {"in the batch": batch[i], "alone": alone, "in the reversed batch": reversed_batch[len(requests) - 1 - i]}
        seen = {name: (res.tokens, _rounds(res, drafts, where)) for name, res in runs.items()}
        if len({repr(v) for v in seen.values()}) == 1:
            continue
        rounds = {name: v[1] for name, v in seen.items()}
        first = next((j for j in range(max(map(len, rounds.values())))
                      if len({repr(r[j] if j < len(r) else None) for r in rounds.values()}) > 1), None)
        shown = "\n".join(f"  {name}: tokens {v[0]}" + ("" if first is None else f", round {first}: "
                          f"{v[1][first] if first < len(v[1]) else 'none'}") for name, v in seen.items())
        differs = "its tokens differ" if first is None else (
            f"round {first} differs ((start, proposed, accepted, emitted{', drafts' if drafts else ''}))")
        raise AssertionError(f"{where} depends on its batch: {differs}:\n{shown}\n  replay: {ctx.replay}"
                             f"{row_dependence_note()}")
