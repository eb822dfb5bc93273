"""The drafts in the round records (contract "Drafts in the round records", capability ``round_drafts``): what the
reference reports, how a backend that does not claim it is judged, a claim not honoured, and the bugs that only the
drafts show (the counts-only checks pass them: the new mutants run with ``round_drafts`` unclaimed)."""
import dataclasses

import pytest
import torch

from conformance.registry import CheckContext, all_cases, run_case
from conformance.tree_proposer_checks import tree_drafter
from specdec_fixtures.mutants import MUTANTS
from specdec_properties.proposals import greedy_round, law_of
from specdec_properties.tree_proposals import greedy_tree, sampled_tree_verdict
from specdec_ref.backend import ReferenceBackend
from specdec_ref.contract import Request
from specdec_ref.decode import SpeculativeDecoder
from specdec_ref.exact.heads import exact_eagle_head
from specdec_ref.exact import exact_model, exact_pair
from specdec_ref.proposers import Ngram
from specdec_ref.tree_decode import TreeSpeculativeDecoder
from specdec_ref.warp import SamplingConfig

TARGET = "order1-target"


@pytest.fixture(scope="module")
def target():
    return exact_pair("order1-close").target.load(torch.float32)


def test_chain_records_carry_the_rules_drafts(target):
    """Every greedy round's reported drafts are the rule's (prompt lookup, EAGLE), as many as proposed; a round without
    drafts reports none."""
    table = exact_model(TARGET)
    for spec in (Ngram(1, 3), exact_eagle_head(target, TARGET, sample=False)):
        law = law_of(spec, TARGET)
        for prompt in ([3], [1, 2, 1, 2], [5, 0, 5]):
            res = SpeculativeDecoder().decode(target, spec, torch.tensor([prompt]), k=3, max_new_tokens=16)
            text = prompt + res.tokens
            for r in res.rounds:
                assert len(r.drafts) == r.proposed and r.parents is None
                expected = greedy_round(table, law, text[: r.start], 3)
                assert expected is None or r.drafts == expected[0][: len(r.drafts)], (prompt, r)


@pytest.mark.parametrize("kind", ["draft_model", "medusa", "eagle", "mtp"])
def test_tree_records_carry_the_exact_tree(kind):
    """Greedy tree rounds report the exact tree node by node (tokens, parents, probabilities within the rule's
    tolerance); sampled ones follow the rule; decode_tree_batch's rows report what decode_tree does."""
    model, spec, law = tree_drafter(kind, False)
    table = exact_model(TARGET)
    res = TreeSpeculativeDecoder().decode(model, spec, torch.tensor([[1, 2, 1]]), depth=3, width=2, max_new_tokens=16)
    full = [1, 2, 1] + res.tokens
    compared = 0
    for r in res.rounds[:-1]:
        tree = greedy_tree(table, law, full[: r.start], 3, 2)
        if tree is not None:
            compared += 1
            assert (r.drafts, r.parents) == (tree.tokens, tree.parents)
            assert r.draft_probs == pytest.approx(tree.probs, rel=1e-4, abs=1e-6)
    assert compared >= 3
    model, spec, law = tree_drafter(kind, True)
    config = SamplingConfig(temperature=1.0)
    res = TreeSpeculativeDecoder().decode(model, spec, torch.tensor([[1, 2, 1]]), depth=3, width=2, max_new_tokens=16,
                                          sampling=config, generator=torch.Generator().manual_seed(5))
    full = [1, 2, 1] + res.tokens
    verdicts = [sampled_tree_verdict(law, full[: r.start], 3, 2, config, r.drafts, r.parents, r.draft_probs)[0]
                for r in res.rounds[:-1]]
    assert set(verdicts) <= {"ok", "tie"} and verdicts.count("ok") >= 3, verdicts
    if kind in ("draft_model", "medusa"):  # the batched tree decoder's rows: the same records
        request = Request(prompt=[1, 2, 1], max_new_tokens=16, sampling=config, seed=5)
        alone = TreeSpeculativeDecoder().decode(model, spec, torch.tensor([[1, 2, 1]]), depth=3, width=2,
                                                max_new_tokens=16, sampling=config,
                                                generator=torch.Generator().manual_seed(5))
        (row,) = TreeSpeculativeDecoder().decode_tree_batch(model, spec, [request], depth=3, width=2)
        assert row.rounds == alone.rounds and [r.draft_probs for r in row.rounds] == [r.draft_probs for r in alone.rounds]


def test_a_tree_that_breaks_the_rule_is_named():
    """The sampled tree rule names the node: a wrong parent, a token of probability 0, a wrong reported probability,
    a tree of the wrong size."""
    from specdec_properties.proposals import MedusaLaw

    law, config = MedusaLaw(TARGET, 3), SamplingConfig(temperature=1.0)
    text = [1, 2, 1]
    model, spec, _ = tree_drafter("medusa", True)
    for seed in range(20):  # a first round whose expansion is no near tie
        res = TreeSpeculativeDecoder().decode(model, spec, torch.tensor([text]), depth=3, width=2, max_new_tokens=3,
                                              sampling=config, generator=torch.Generator().manual_seed(seed))
        r = res.rounds[0]
        tokens, parents, probs = list(r.drafts), list(r.parents), list(r.draft_probs)
        if sampled_tree_verdict(law, text, 3, 2, config, tokens, parents, probs)[0] == "ok":
            break
    else:
        raise AssertionError("every seed's first tree is a near tie")
    status, why = sampled_tree_verdict(law, text, 3, 2, config, tokens[:-1], parents[:-1], probs[:-1])
    assert status == "violation" and "9 nodes drafted; the rule drafts 10" in why
    status, why = sampled_tree_verdict(law, text, 3, 2, config, tokens, parents[:6] + [9, 9, 9, 9], probs)
    assert status == "violation" and "node 6 (level 3) hangs under node 9" in why
    status, why = sampled_tree_verdict(law, text, 3, 2, config, tokens, parents, [probs[0] * 1.01] + probs[1:])
    assert status == "violation" and "node 0 (level 1" in why and "reported with probability" in why


class _DropsDrafts(ReferenceBackend):
    """Claims round_drafts (the reference's capabilities) but leaves its records without them."""

    def decode(self, *args, **kwargs):
        result = super().decode(*args, **kwargs)
        for r in result.rounds:
            r.drafts = None
        return result


def test_a_claim_not_honoured_fails_and_an_unclaimed_one_is_judged_by_counts():
    (case,) = [c for c in all_cases(["proposer_greedy_acceptance_is_exact"]) if c.case_id == "medusa"]
    record = run_case(case, _DropsDrafts(), CheckContext())
    assert record.status == "failed" and "claims round_drafts but round 0 reports drafts=None" in record.message
    quiet = _DropsDrafts()
    quiet.capabilities = dataclasses.replace(quiet.capabilities, round_drafts=False)
    record = run_case(case, quiet, CheckContext())
    assert record.status == "passed" and any(f["kind"] == "drafts_not_reported" for f in record.findings)
    (rule,) = [c for c in all_cases(["tree_proposer_sampled_trees_follow_the_rule"]) if c.case_id == "medusa"]
    record = run_case(rule, quiet, CheckContext())
    assert record.status == "skipped" and "round_drafts" in record.message


#: The bugs only the drafts show, with the deterministic check each passes on its counts alone (the check before
#: round_drafts) and fails on its drafts.
ONLY_THE_DRAFTS_SHOW = [
    ("eagle3_later_drafts_unmapped", "proposer_greedy_acceptance_is_exact", "eagle3"),
    ("tree_ranks_by_node_probability", "tree_proposer_greedy_acceptance_is_exact", "medusa"),
    ("tree_node_fed_first_nodes_feature", "tree_proposer_greedy_acceptance_is_exact", "eagle"),
]


@pytest.mark.parametrize("name, check, case_id", ONLY_THE_DRAFTS_SHOW)
def test_counts_alone_miss_what_the_drafts_show(name, check, case_id):
    (case,) = [c for c in all_cases([check]) if c.case_id == case_id]
    backend = MUTANTS[name].backend()
    assert run_case(case, backend, CheckContext()).status == "failed"
    backend.capabilities = dataclasses.replace(backend.capabilities, round_drafts=False)
    record = run_case(case, backend, CheckContext())
    assert record.status == "passed", record.message[:500]


def test_ranking_by_the_nodes_own_probability_needs_depth_3():
    """At depth 2 every root child is expanded whatever the ranking: the mutant's trees are the reference's there."""
    model, spec, _ = tree_drafter("medusa", False)
    bad = MUTANTS["tree_ranks_by_node_probability"].impl()
    for prompt in ([1, 2], [5, 0, 3], [4, 4]):
        for width in (2, 3):
            runs = [dec.decode(model, spec, torch.tensor([prompt]), depth=2, width=width, max_new_tokens=12).rounds
                    for dec in (TreeSpeculativeDecoder(), bad)]
            assert [(r.drafts, r.parents) for r in runs[0]] == [(r.drafts, r.parents) for r in runs[1]]


#: Each new bug, caught by the sampled family alone: (mutant, sampled check, its case).
SAMPLED_FAMILY_CATCHES = [
    ("eagle3_later_drafts_unmapped", "proposer_acceptance_is_exact", "eagle3-one_hot"),
    ("ngram_pads_short_proposals", "proposer_acceptance_is_exact", "ngram-one_hot"),
    ("tree_ranks_by_node_probability", "tree_proposer_sampled_trees_follow_the_rule", "medusa"),
    ("tree_node_fed_first_nodes_feature", "tree_proposer_sampled_trees_follow_the_rule", "eagle"),
]


@pytest.mark.parametrize("name, check, case_id", SAMPLED_FAMILY_CATCHES)
def test_a_backend_claiming_sampling_only_is_still_caught(name, check, case_id):
    """Without ``greedy`` (the greedy checks skipped), the sampled checks reject each bug: deterministically, from the
    drafts and counts of the sampled rounds (at the interim look for the statistical acceptance check)."""
    backend = MUTANTS[name].backend()
    backend.capabilities = dataclasses.replace(backend.capabilities, greedy=False)
    (case,) = [c for c in all_cases([check]) if c.case_id == case_id]
    record = run_case(case, backend, CheckContext(profile="dev"))
    assert record.status == "failed" and " round " in record.message, record.message[:500]
