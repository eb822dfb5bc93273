"""Argmax-draft rounds rebuilt from completions (conformance.engines.rounds) and the head folders engines load
(specdec_ref.exact.head_files). No engine: the vLLM side is engine_tests/test_vllm_heads.py and the matrix."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conformance.engines import rounds as R
from conformance.engines.matrix import Configuration
from specdec_properties.proposals import Eagle3FeatureLaw, EagleLaw, MedusaLaw, NgramLaw
from specdec_ref.exact.heads import EAGLE_ALPHA
from specdec_ref.warp import SamplingConfig

EAGLE = EagleLaw("order1-target", EAGLE_ALPHA, False)


def _greedy_chain(law, text, k):
    return list(R.argmax_drafts(law, text, k)[0])


def test_a_round_accepts_the_leading_drafts_that_equal_the_next_tokens():
    prompt = [5, 0]
    first = 3
    drafts = _greedy_chain(EAGLE, prompt + [first], 3)
    # the engine accepted the first draft, then emitted another token than the second one
    other = (drafts[1] + 1) % 8
    completion = [first, drafts[0], other]
    rounds = R.reconstruct(EAGLE, prompt, completion, 3)
    assert rounds[0].drafts == tuple(drafts) and rounds[0].accepted == 1 and not rounds[0].censored
    assert rounds[0].start == 3


def test_a_round_cut_by_max_tokens_is_censored_and_greedy_requests_settle_it():
    prompt = [5, 0]
    first = 3
    drafts = _greedy_chain(EAGLE, prompt + [first], 3)
    completion = [first, drafts[0]]  # max_tokens 2: the round was cut after one visible draft
    (r,) = R.reconstruct(EAGLE, prompt, completion, 3)
    assert r.censored and r.accepted == 1 and r.upper == 3
    settled = R.reconstruct(EAGLE, prompt, completion, 3, extend=R.greedy_next("order1-target"))[0]
    assert not settled.censored and 1 <= settled.accepted <= 3
    # no prefill convention: the first round starts from the prompt itself
    assert R.reconstruct(EAGLE, prompt, completion, 3, prefill=False)[0].start == 2


def test_ngram_without_a_match_is_a_plain_step_and_proposals_may_be_short():
    law = NgramLaw(1, 2)
    rounds = R.reconstruct(law, [1, 2], [3, 1, 2, 3], 3)
    # [1,2,3]: no earlier 3 -> plain step; [1,2,3,1]: '1' at 0 -> drafts [2,3,1]
    assert rounds[0].start == 4 and rounds[0].drafts == (2, 3, 1)
    assert R.reconstruct(law, [7, 7], [7, 7], 3)[0].drafts == (7,)  # the tokens until the end of the context


def _simulate(law, engine_law, n, seed=0, k=3, max_new=8, temperature=0.7, to_end=False):
    """A vLLM-like engine: the first token at prefill, rounds of argmax drafts from ``engine_law``, a draft accepted
    when the target's sample equals it, acceptance counted past the cut. ``to_end``: llama.cpp-like instead, rounds
    of ``min(k, r - 1)`` drafts with ``r`` tokens still to emit, each request reporting its totals only."""
    from specdec_ref.exact.heads import order1_table

    t = order1_table("order1-target") / temperature
    p = np.exp(t - t.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    rng = np.random.default_rng(seed)
    records, counters = [], {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": [0] * k}
    for i in range(n):
        prompt = [5, i % 7]
        text = list(prompt)
        for _ in range(max_new + k + 1):
            text.append(int(rng.choice(8, p=p[text[-1]])))
        pos, end, steps = len(prompt) + 1, len(prompt) + max_new, []
        while pos < end:
            room = min(k, end - pos - 1) if to_end else k
            drafts = list(R.argmax_drafts(engine_law, text[:pos], room)[0]) if room > 0 else []
            if not drafts:  # n-gram without a match: a plain step, not counted
                pos += 1
                continue
            m = 0
            while m < len(drafts) and text[pos + m] == drafts[m]:
                m += 1
            steps.append([len(drafts), m])
            counters["drafts"] += 1
            counters["draft_tokens"] += len(drafts)
            counters["accepted"] += m
            for j in range(m):
                counters["accepted_per_pos"][j] += 1
            pos += m + 1
        rec = {"prompt_ids": prompt, "completion_ids": text[len(prompt):end], "seed": i}
        rec.update({"draft_tokens": sum(s[0] for s in steps), "accepted": sum(s[1] for s in steps)} if to_end
                   else {"rounds": steps})
        records.append(rec)
    return records, counters


@pytest.mark.parametrize("law", [EAGLE, MedusaLaw("order1-target", 3), NgramLaw(1, 2)], ids=["eagle", "medusa", "ngram"])
def test_an_engine_with_the_declared_drafter_matches_its_rounds_exactly_and_in_expectation(law):
    records, counters = _simulate(law, law, 400)
    out = R.check_rounds(law, records, 3, prefill=True, counters=counters)
    assert out["passed"] is True and out["per_request"], out["text"]
    assert out["reconstructed"]["censored"] > 0  # the bounds were needed
    eff = R.conditional_acceptance("order1-target", law, records, out["rounds"], SamplingConfig(temperature=0.7), 3,
                                   counters["accepted_per_pos"])
    assert eff["passed"] is True, eff["verdict"]


def test_a_drafter_reading_the_feature_one_position_early_is_named_at_its_first_round():
    early = EagleLaw("order1-target", EAGLE_ALPHA, False, feature_back=2)
    records, counters = _simulate(EAGLE, early, 200, seed=1)
    out = R.check_rounds(EAGLE, records, 3, prefill=True, counters=counters)
    assert out["passed"] is False and out["text"].startswith("DIFFERS") and "request " in out["problems"][0]
    # without per-request rounds, the totals alone still differ
    bare = [{k: v for k, v in r.items() if k != "rounds"} for r in records]
    assert R.check_rounds(EAGLE, bare, 3, prefill=True, counters=counters)["passed"] is False


def test_drafts_to_the_end_are_rebuilt_per_request_and_a_wrong_drafter_or_rule_is_named():
    """llama.cpp's rule (``drafts_to_end``: ``min(k, r - 1)`` drafts, none in the last position) and its per-request
    totals: the rebuild equals every request's totals with no censored round; a drafter reading the feature one
    position early, or the rebuild assuming vLLM's full count, is named at its first differing request."""
    records, counters = _simulate(EAGLE, EAGLE, 300, seed=2, to_end=True)
    totals = {"draft_tokens": counters["draft_tokens"], "accepted": counters["accepted"]}
    out = R.check_rounds(EAGLE, records, 3, prefill=True, counters=totals, max_new=8)
    assert out["passed"] is True and "every request's totals" in out["text"], out["text"]
    assert out["reconstructed"]["censored"] == 0
    assert max(len(r.drafts) for r in out["rounds"] if r.start == 2 + 8 - 2) <= 1  # one token left to emit: 1 draft
    eff = R.conditional_acceptance("order1-target", EAGLE, records, out["rounds"], SamplingConfig(temperature=0.7), 3,
                                   counters["accepted_per_pos"])
    assert eff["passed"] is True, eff["verdict"]
    early = EagleLaw("order1-target", EAGLE_ALPHA, False, feature_back=2)
    wrong, wrong_counters = _simulate(EAGLE, early, 300, seed=2, to_end=True)
    bad = R.check_rounds(EAGLE, wrong, 3, prefill=True, counters=None, max_new=8)
    assert bad["passed"] is False and bad["problems"][0].startswith("request "), bad["text"]
    full = R.check_rounds(EAGLE, records, 3, prefill=True, counters=totals)  # vLLM's rule on llama.cpp's rounds
    assert full["passed"] is False, full["text"]


def test_the_draft_model_law_and_configuration_declarations():
    law = R.proposal_law("draft", "order1-close")
    assert isinstance(law, R.DraftArgmaxLaw) and law.count([3], 3) == 3
    assert R.proposal_law("exact-medusa:3", "order1-close") == MedusaLaw("order1-target", 3, False)
    with pytest.raises(ValueError):
        R.proposal_law("suffix", "order1-close")
    with pytest.raises(ValueError):
        Configuration("x", "eagle", {}, None, proposer="exact-eagle")  # a proposer drafts its argmax: one_hot
    with pytest.raises(ValueError):
        Configuration("x", "eagle", {}, "token", proposer="exact-eagle")
    assert Configuration("x", "draft-eagle3", {}, "sample_match", proposer="exact-eagle3").proposer == "exact-eagle3"
    with pytest.raises(ValueError):
        Configuration("x", None, proposer="exact-eagle")


def _read_safetensors(blob: bytes) -> dict[str, np.ndarray]:
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    dtypes = {"F32": "<f4", "I64": "<i8"}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtypes[v["dtype"]]).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def test_head_files_are_deterministic_and_compute_the_laws_they_stand_for(tmp_path):
    from specdec_ref.exact import head_files as F
    from specdec_ref.exact.heads import order1_table

    a, b = F.head_folder("eagle", root=tmp_path), F.head_folder("eagle", root=tmp_path / "again")
    assert a.name == b.name and (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    t = order1_table("order1-target")
    lm_head = np.zeros((8, 16))
    lm_head[:, :8] = t.T / 4  # the target's lm_head: logits(4 e_t) = T[t]
    w = _read_safetensors(F.head_files("eagle")["model.safetensors"])
    assert "lm_head.weight" not in w and "layers.0.input_layernorm.weight" not in w  # vLLM refuses both
    assert not w["layers.0.self_attn.o_proj.weight"].any() and not w["layers.0.mlp.down_proj.weight"].any()
    eye = np.eye(16) * 4
    for y in range(8):
        for x in range(8):
            h = w["fc.weight"] @ np.concatenate([eye[x], eye[y]])  # cat(embed(token), feature), vLLM's order
            assert np.array_equal(lm_head @ h, EAGLE.raw([y, x], []))
    m = _read_safetensors(F.head_files("medusa", heads=3)["model.safetensors"])
    law = MedusaLaw("order1-target", 3)
    for i in range(3):
        assert not m[f"blocks.{i}.layers.0.weight"].any()
        for y in range(8):
            assert np.array_equal(m[f"lm_heads.{i}.weight"] @ eye[y], law.raw([y, 0], [0] * i))
    assert json.loads(F.head_files("medusa")["config.json"])["num_heads"] == 3


EAGLE3 = Eagle3FeatureLaw("order1-target", (0, 1, 2, 3, 5, 7))


def _eagle3_drafter(w: dict, eps: float, aux_order=(0, 1, 2)):
    """vLLM 0.32's EAGLE-3 forward (``llama_eagle3.py``) in float64 (the norm's variance in float32) from the head
    file's weights, for the feature of
    ``y`` on the deep target: ``g = fc(cat(aux streams in aux_order))``; the midlayer adds ``o_proj(..)`` and
    ``down_proj(..)``, both zero, so ``pre = g``; logits ``lm_head(norm(pre))`` spread to target ids by ``d2t`` (-inf
    elsewhere); the next step reads ``pre`` without ``fc``. Returns the logits of k = 3 steps."""
    from specdec_ref.exact.deep import deep_channel

    assert not w["midlayer.self_attn.o_proj.weight"].any() and not w["midlayer.mlp.down_proj.weight"].any()

    def logits(pre):  # the norm's variance + eps in float32, as the engine's float32 drafter has it
        post = pre / np.sqrt(np.float64(np.float32((pre ** 2).mean()) + np.float32(eps))) * w["norm.weight"]
        out = np.full(8, -np.inf)
        out[np.arange(len(w["d2t"])) + w["d2t"]] = w["lm_head.weight"].astype(np.float64) @ post
        return out

    def run(y):
        aux = np.concatenate([4 * np.eye(16)[deep_channel(y, layer)] for layer in aux_order])
        pre = w["fc.weight"].astype(np.float64) @ aux
        return [logits(pre) for _ in range(3)]  # every step: pre = g (its own feature, no fc)
    return run


def test_eagle3_head_files_are_deterministic_dyadic_and_compute_the_law_from_the_aux_layers(tmp_path):
    from specdec_ref.exact import head_files as F
    a, b = F.head_folder("eagle3", root=tmp_path), F.head_folder("eagle3", root=tmp_path / "again")
    assert a.name == b.name
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in ("config.json", "model.safetensors"))
    config = json.loads((a / "config.json").read_text())
    assert config["draft_vocab_size"] == 6 and config["num_hidden_layers"] == 1
    assert "eagle_aux_hidden_state_layer_ids" not in json.dumps(config)  # vLLM's default ids: (2, 1, 0) for 3 layers
    eps = config["rms_norm_eps"]
    assert np.float32(1) + np.float32(eps) == np.float32(1)  # the norms of mean-square-1 rows stay exact in float32
    w = _read_safetensors((a / "model.safetensors").read_bytes())
    assert w["d2t"].dtype == np.int64 and list(np.arange(6) + w["d2t"]) == [0, 1, 2, 3, 5, 7]
    assert w["fc.weight"].shape == (16, 48) and w["lm_head.weight"].shape == (6, 16)
    for name, x in w.items():
        if x.dtype.kind == "f":
            assert np.all(np.abs(x) < 8) and np.all(x * 64 == np.round(x * 64)), name
    run = _eagle3_drafter(w, eps)
    for y in range(8):
        for x in range(8):
            for i, row in enumerate(run(y)):  # the token x plays no part; each step the same row
                assert np.array_equal(row, EAGLE3.raw([y, x], [0] * i)), (y, x, i)
    # the weights tell the layers apart: the streams concatenated in another order propose other drafts
    for order in ((2, 1, 0), (1, 0, 2), (0, 2, 1)):
        wrong = _eagle3_drafter(w, eps, order)
        assert any(int(np.argmax(wrong(y)[0])) != int(np.argmax(EAGLE3.raw([y, 0], []))) for y in range(8)), order


def test_deep_target_folder_holds_the_deep_targets_weights(tmp_path):
    import torch

    from specdec_ref.exact import head_files as F
    from specdec_ref.exact.deep import deep_target
    from specdec_ref.exact import exact_model

    folder = F.deep_target_folder("order1-target", 3, root=tmp_path)
    again = F.deep_target_folder("order1-target", 3, root=tmp_path / "again")
    assert folder.name == again.name
    assert (folder / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
    shipped = exact_model("order1-target").path
    config = json.loads((folder / "config.json").read_text())
    assert config == dict(json.loads((shipped / "config.json").read_text()), num_hidden_layers=3)
    for n in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (folder / n).read_bytes() == (shipped / n).read_bytes()
    w = _read_safetensors((folder / "model.safetensors").read_bytes())
    state = deep_target("order1-target", 3).state_dict()
    assert set(w) == set(state)
    for name, x in w.items():
        assert torch.equal(torch.from_numpy(x.copy()), state[name]), name


def test_the_eagle3_law_repeats_the_feature_row_on_the_draft_vocabulary():
    from specdec_ref.exact.heads import medusa_table

    assert R.proposal_law("exact-eagle3", "order1-close") == EAGLE3
    m2 = medusa_table("order1-target", 2)
    for y in range(8):
        drafts, _ = R.argmax_drafts(EAGLE3, [y, 3], 3)
        best = max((0, 1, 2, 3, 5, 7), key=lambda t: (m2[y, t], -t))
        assert drafts == (best,) * 3
    assert EAGLE3.count([4], 3) == 0 and EAGLE3.count([4, 1], 3) == 3


class _PendingFeature(Eagle3FeatureLaw):
    """A drafter that reads the pending token's feature (one position late) instead of the one before it."""

    def raw(self, text, drafts):
        return super().raw(list(text) + [0], drafts)


def test_eagle3_rounds_match_their_law_and_a_late_feature_is_named():
    records, counters = _simulate(EAGLE3, EAGLE3, 400)
    out = R.check_rounds(EAGLE3, records, 3, prefill=True, counters=counters)
    assert out["passed"] is True and out["per_request"], out["text"]
    eff = R.conditional_acceptance("order1-target", EAGLE3, records, out["rounds"], SamplingConfig(temperature=0.7), 3,
                                   counters["accepted_per_pos"])
    assert eff["passed"] is True, eff["verdict"]
    late = _PendingFeature("order1-target", EAGLE3.vocab)
    records, counters = _simulate(EAGLE3, late, 200, seed=2)
    out = R.check_rounds(EAGLE3, records, 3, prefill=True, counters=counters)
    assert out["passed"] is False and "request " in out["problems"][0], out["text"]


def test_sampled_rounds_are_placed_from_the_engines_per_request_rounds():
    """Sampled drafts: the engine's per-request rounds place each round in its completion (the first after the prompt
    and the prefill token, each emitting accepted + 1 tokens, a round with nothing drafted a plain step); rounds that do
    not fit the completion are named."""
    from conformance.engines.sampled_rounds import engine_rounds

    rec = {"prompt_ids": [5, 0], "completion_ids": [1, 2, 3, 4, 5, 6, 7], "rounds": [[3, 1], [0, 0], [3, 3]]}
    rounds, problem = engine_rounds([rec], prefill=True)
    assert problem is None
    assert [(r.start, r.accepted, len(r.drafts), r.censored) for r in rounds] == [(3, 1, 3, False), (6, 3, 3, False)]
    cut, problem = engine_rounds([dict(rec, completion_ids=[1, 2, 3, 4, 5], rounds=[[3, 1], [3, 3]])], prefill=True)
    assert problem is None and [(r.start, r.censored) for r in cut] == [(3, False), (5, True)]  # 3 accepted, 2 visible
    _, problem = engine_rounds([dict(rec, rounds=[[3, 0]])], prefill=True)
    assert problem and "end at token 4 of a text of 9" in problem
    _, problem = engine_rounds([dict(rec, rounds=[[3, 3], [3, 3], [3, 0]])], prefill=True)
    assert problem and "round 3 of 3 starts at 11" in problem
    _, problem = engine_rounds([{k: v for k, v in rec.items() if k != "rounds"}], prefill=True)
    assert problem and "no per-request rounds" in problem


def test_sampled_rounds_efficiency_names_acceptance_and_counters_that_depart(tmp_path):
    """The sampled proposer's efficiency check can fail: rounds of the exact EAGLE head (T 0.7) that accept nothing,
    far below the exact P(m >= 1 | text), fail at position 1; counters that differ from the per-request rounds are named
    before any statistics."""
    from types import SimpleNamespace

    from conformance.engines.adapter import Conventions
    from conformance.engines.sampled_rounds import sampled_rounds_of

    rng = np.random.default_rng(0)
    records = []
    for i in range(300):  # first token at prefill, then nine rounds of 3 drafts that accept none: one token each
        records.append({"prompt_ids": [5, i % 7], "completion_ids": [int(t) for t in rng.integers(0, 8, 10)],
                        "rounds": [[3, 0]] * 9})
    path = tmp_path / "efficiency.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ad = SimpleNamespace(families={"order1": "order1-close"}, k_of=lambda cfg: 3,
                         conventions=Conventions(first_token_at_prefill=True))
    cfg = Configuration("eagle-prob", "eagle", {}, "token", sampled_proposer="exact-eagle")
    eff = {"status": "ok", "file": str(path), "n": len(records), "drafts": 2700, "draft_tokens": 8100, "accepted": 0,
           "accepted_per_pos": [0, 0, 0], "counters_source": "engine"}
    out = sampled_rounds_of(ad, cfg, {"efficiency": eff})
    assert out["passed"] is False and out["verdict"].startswith("FAILS efficiency: position 1"), out["verdict"]
    assert out["drafts"] == 2700 and out["positions"][0]["expected"] > 0.5
    wrong = sampled_rounds_of(ad, cfg, {"efficiency": dict(eff, accepted=5)})
    assert wrong["passed"] is False and "accepted 5 counted, 0 in the per-request rounds" in wrong["verdict"]


def test_the_expectation_of_ngram_rounds_on_the_order2_target_keys_rounds_by_what_the_target_reads():
    """Two n-gram rounds with the same pending token and the same drafts, from texts whose last two tokens or position
    parity differ: on the order-2 target their acceptance laws differ (0.31 against 0.79 expected accepted drafts), so
    the expectation cannot be cached under (pending token, drafts), as it once was (8.6 SE off on a correct engine)."""
    from specdec_properties.exact import SchemeSpec
    from specdec_properties.proposals import round_acceptance
    from specdec_ref.exact import exact_model

    law, config = NgramLaw(1, 2), SamplingConfig(temperature=0.7)
    texts = [[6, 0, 0], [6, 0, 0, 0], [6, 0, 0], [6, 1, 0, 0]]
    assert len({(t[-1], tuple(law.proposal(t, 3))) for t in texts}) == 1  # the old key: one entry for all four
    records = [{"prompt_ids": t, "completion_ids": [], "seed": i} for i, t in enumerate(texts)]
    rounds = [R.Round(i, len(t), tuple(law.proposal(t, 3)), 0, False) for i, t in enumerate(texts)]
    eff = R.conditional_acceptance("order2-target", law, records, rounds, config, 1, None)
    target = exact_model("order2-target")
    direct = [round_acceptance(target, law, t, [], config, len(r.drafts), SchemeSpec(name="token"))[1:].sum()
              for t, r in zip(texts, rounds)]
    assert max(direct) - min(direct) > 0.4
    assert eff["positions"][0]["expected"] == pytest.approx(np.mean(direct), abs=1e-12)
    assert eff["distinct_round_starts"] == 2



class _FixedDrafts:
    """A proposer that always drafts ``drafts`` (truncated to the room the round has)."""

    def __init__(self, drafts):
        self.drafts = list(drafts)

    def proposal(self, text, k):
        return self.drafts[:k]


@pytest.mark.parametrize("drafts, completion, rule, accepted, censored", [
    ((7, 1), [5, 7], None, 1, True),  # a matched EOS is an accepted draft; what followed is unknown
    ((7, 1), [5, 7], 7, 0, False),  # llama.cpp: before the last draft it is the round's own token
    ((1, 7), [5, 1, 7], 7, 2, False),  # at the last draft it is accepted
    ((1, 2), [5, 1, 7], 7, 1, False),  # an EOS the target sampled against another draft: an ordinary rejection
])
def test_a_drafted_eos_is_counted_by_the_engines_declared_rule(drafts, completion, rule, accepted, censored):
    """llama.cpp's verifier stops at a drafted EOS the target matched before the round's last draft and counts it as
    the target's token (its counters say 0 accepted where the rounds rebuilt under the usual rule say 1..2: found under
    the prefix-cache condition, the same without the cache); ``Conventions.eos_draft="target"`` states it."""
    from conformance.engines.rounds import reconstruct

    rounds = reconstruct(_FixedDrafts(drafts), [6, 0], completion, 2, prefill=True, eos_ends_round=rule)
    assert [(r.accepted, r.censored) for r in rounds] == [(accepted, censored)]


def test_a_draft_that_reads_the_whole_context_is_read_over_it():
    """The long family's draft reads the marker token, far behind: its argmax drafts follow the whole text (context
    None), so two prompts that differ only in their marker get different drafts; the order-1 reading (the row of the
    last token), right for order1 drafts and order2-draft, would give both the same."""
    from conformance.engines.conditions import LONG_MARKER_AT as at, condition
    from specdec_ref.exact import exact_model

    assert R.DraftArgmaxLaw("order2-draft").context == 1 and R.DraftArgmaxLaw("order1-draft-close").context == 1
    law = R.DraftArgmaxLaw("long-draft")
    assert law.context is None
    prompts = condition("long-prefix-cache").cases[0].prompts
    first, twin = list(prompts[0]), list(prompts[2])  # the same text but the marker (m1 / m2 at position ``at``)
    assert first[:at] == twin[:at] and first[at + 1:] == twin[at + 1:] and first[at] != twin[at]
    d1, d2 = R.argmax_drafts(law, first, 3)[0], R.argmax_drafts(law, twin, 3)[0]
    assert d1 != d2
    m, text = exact_model("long-draft"), list(first)
    for d in d1:  # the draft's own argmax chain over the whole text
        assert d == int(m.next_logits([text])[0].argmax())
        text.append(d)
    with pytest.raises(ValueError, match="reads more than the last token"):
        R.greedy_next("long-target")


def test_a_prefill_step_counted_as_a_round_is_named_with_every_later_round_equal():
    """vLLM counts the step of a one-token prefill (after a prefix-cache hit) as a round of k placeholder drafts, all
    rejected: the rounds check fails (the counts are not the draft's) and says that every differing request differs
    only so; a request that departs otherwise is counted apart."""
    law = R.DraftArgmaxLaw("order1-draft-close")
    prompt, completion = [1], [4, 4, 5, 2, 0, 3, 3]
    mine = R.reconstruct(law, prompt, completion, 3)
    rounds = [[len(r.drafts), r.upper] for r in mine]
    rec = {"prompt_ids": prompt, "completion_ids": completion, "seed": 0}
    assert R.check_rounds(law, [{**rec, "rounds": rounds}], 3, prefill=True, counters=None)["passed"]
    phantom = R.check_rounds(law, [{**rec, "rounds": [[3, 0]] + rounds}] * 2, 3, prefill=True, counters=None)
    assert not phantom["passed"] and "all 2 differing requests: the engine counts one round more" in phantom["text"]
    other = [[3, 0]] + [[d, (a + 1) % (d + 1)] for d, a in rounds]
    mixed = R.check_rounds(law, [{**rec, "rounds": [[3, 0]] + rounds}, {**rec, "rounds": other}], 3, prefill=True,
                           counters=None)
    assert "(2 requests differ; 1 of them only by a leading round of 3 drafted, 0 accepted)" in mixed["text"]


def test_rounds_are_compared_up_to_the_draft_s_positions_for_a_draft_that_reads_the_whole_text():
    """A draft whose law reads the whole text (the long family's) has no law past its model's positions; an engine
    that drafts past the context's end (vLLM) is compared up to the first round whose drafts would read more: a
    request ending at position 4 096 is compared on its first rounds (a wrong one is still named), never a tool
    error, and what follows is not judged."""
    from conformance.engines.conditions import condition

    law = R.DraftArgmaxLaw("long-draft")
    assert law.max_positions == 4096 and R.DraftArgmaxLaw("order2-draft").max_positions is None
    prompt = list(condition("long-context-edge").cases[0].prompt)
    text = list(prompt)
    for j in range(8):  # the completion: the draft's own argmax chain but its third token, so that a round starts at
        d = R.argmax_drafts(law, text, 1)[0][0]  # 4 095 and its drafts would read 4 097 tokens
        text.append((d + 1) % 6 if j == 2 else d)
    completion = text[len(prompt):]
    mine = R.reconstruct(law, prompt, completion, 3, positions=4096)
    assert mine.truncated and mine and all(r.start + len(r.drafts) - 1 <= 4096 for r in mine)
    rec = {"prompt_ids": prompt, "completion_ids": completion, "seed": 0}
    rounds = [[len(r.drafts), r.upper] for r in mine]
    ok = R.check_rounds(law, [{**rec, "rounds": rounds + [[3, 0], [3, 0]]}], 3, prefill=True, counters=None,
                        positions=4096)
    assert ok["passed"] and "1 requests compared up to their first round" in ok["text"], ok["text"]
    bad = R.check_rounds(law, [{**rec, "rounds": [[3, 0]] + rounds[1:]}], 3, prefill=True, counters=None,
                         positions=4096)
    assert bad["passed"] is False and "round 1" in bad["text"]


def _token_wise_records(n: int, k: int, max_new: int, seed: int, accept_scale: float = 1.0) -> list[dict]:
    """Requests of token-wise rejection sampling on the order-1 pair (T 1, the first draft round from the prompt, as
    ONNX Runtime GenAI runs it), each with its rounds ``[drafted, accepted]``; ``accept_scale`` < 1: a planted
    draft-side bug that keeps each draft with only that share of the exact probability."""
    from specdec_properties.sequences import next_token_law
    from specdec_ref.exact import exact_model
    from specdec_ref.warp import SamplingConfig

    t1 = SamplingConfig(temperature=1.0)
    rows = {name: next_token_law(exact_model(name), [0], [(v,) for v in range(8)], t1).numpy()
            for name in ("order1-target", "order1-draft-close")}  # order-1: the law reads the last token only
    p, q = rows["order1-target"], rows["order1-draft-close"]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt, toks, rounds = [2, 6], [], []
        while len(toks) < max_new:
            last, drafts = (toks or prompt)[-1], []
            for _ in range(min(k, max_new - len(toks))):
                drafts.append(int(rng.choice(8, p=q[(drafts or [last])[-1]])))
            accepted, prev = 0, last
            for d in drafts:
                if rng.random() < accept_scale * min(1.0, p[prev, d] / q[prev, d]):
                    toks.append(d)
                    accepted, prev = accepted + 1, d
                    continue
                resid = np.maximum(p[prev] - q[prev], 0)
                toks.append(int(rng.choice(8, p=resid / resid.sum())))
                break
            else:
                if len(toks) < max_new:
                    toks.append(int(rng.choice(8, p=p[prev])))
            rounds.append([len(drafts), accepted])
        out.append({"prompt_ids": prompt, "completion_ids": toks[:max_new], "rounds": rounds})
    return out


def test_sampled_drafts_acceptance_per_position_under_a_condition_matches_and_a_lowered_one_is_named(tmp_path):
    """A configuration with a ``sampled_proposer`` under a serving condition (:func:`sampled_case_rounds`): the engine's
    per-request rounds placed in the completions, the accepted drafts per position against the exact expectation
    given each round's text. Exact token-wise rejection sampling matches; a draft side that keeps each draft with 80 %
    of its exact probability (acceptance lost near a limit, a stale draft cache) fails at every position."""
    from types import SimpleNamespace

    from conformance.engines.adapter import Conventions
    from conformance.engines.matrix import Configuration
    from conformance.engines.sampled_rounds import sampled_case_rounds
    from specdec_ref.warp import SamplingConfig

    ad = SimpleNamespace(conventions=Conventions(first_token_at_prefill=False), families={"order1": "order1-close"},
                         k_of=lambda cfg: 3)
    cfg = Configuration("draft-k3", "draft_model", {}, "token", k=3, sampled_proposer="draft")
    case = SimpleNamespace(model="order1-target", family="order1", sampling=SamplingConfig(temperature=1.0))
    verdicts = {}
    for name, scale in (("exact", 1.0), ("lowered", 0.8)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _token_wise_records(600, 3, 6, 7, scale)))
        verdicts[name] = sampled_case_rounds(ad, cfg, case, {"status": "ok", "dir": str(tmp_path), "file": path.name})
    assert verdicts["exact"]["passed"] is True, verdicts["exact"]["text"]
    assert verdicts["lowered"]["passed"] is False and "position 1" in verdicts["lowered"]["text"], verdicts["lowered"]
    assert all(row["z"] < -5 for row in verdicts["lowered"]["positions"][:2]), verdicts["lowered"]["positions"]
    # rounds that do not fit their completion are named, not placed
    bad = _token_wise_records(3, 3, 6, 8)
    bad[1]["rounds"] = bad[1]["rounds"][:-1]
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    named = sampled_case_rounds(ad, cfg, case, {"status": "ok", "dir": str(tmp_path), "file": "bad.jsonl"})
    assert named["passed"] is False and "request 1" in named["text"], named


def test_a_sampled_draft_round_law_is_over_the_drafts_the_draft_can_propose():
    """The law of one round with sampled drafts is summed over the draft paths of positive probability only: on the
    order-2 pair the draft never proposes ``<bos>`` (id 6), and a path through it is a context the target does not
    define (enumerating every path of the vocabulary raised there)."""
    from specdec_properties.exact import SchemeSpec
    from specdec_properties.proposals import round_acceptance
    from specdec_ref.exact import exact_model

    law = R.DraftArgmaxLaw("order2-draft", sample=True)
    assert not law.one_hot
    m = round_acceptance(exact_model("order2-target"), law, [6, 0, 3], [], SamplingConfig(temperature=1.0), 3,
                         SchemeSpec(name="token"))
    assert m.shape == (4,) and abs(m.sum() - 1.0) < 1e-9 and (m > 0).all()
