"""The continuation-law oracle under history-dependent settings: hand arithmetic, enumeration, and
agreement with the implementation under test (:mod:`specdec_ref.history`)."""
import ast
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, reject, settings
from hypothesis import strategies as st

from conformance.samples import split_ties
from specdec_properties.history_law import history_logits, history_row
from specdec_properties.sequences import boundary_margin, continuation_law, next_token_law, processed_logits64, row_margins
from specdec_ref.automaton import automaton_of
from specdec_ref.history import SamplingState, TokenAutomaton, process_logits, warp_rows
from specdec_ref.warp import SamplingConfig, warp

E = math.e
EOS = 3
#: Order-1 logits of the hand-computed cases (row = last token), V = 4.
TABLE = [
    [0.0, 1.0, 2.0, 0.0],
    [1.0, 2.0, 0.0, -1.0],
    [2.0, 0.0, 1.0, 0.0],
    [0.0, 0.0, 0.0, 0.0],
]


class Order1:
    """An exactly-known order-1 model for ``next_logits64``: the next logits are ``table[last token]`` (float64)."""

    def __init__(self, table):
        self.table = torch.as_tensor(np.asarray(table), dtype=torch.float64)

    def next_logits(self, contexts):
        return self.table[[c[-1] for c in contexts]]


MODEL = Order1(TABLE)


def softmax_at(z, token):
    """``softmax(z)[token]`` written out with math.exp (-inf entries contribute nothing)."""
    return math.exp(z[token]) / math.fsum(math.exp(x) for x in z if x != -math.inf)


# --------------------------------------------------------------------------- hand arithmetic


def test_frequency_penalty_leaves_by_hand():
    law = continuation_law(MODEL, [0], 3, SamplingConfig(frequency_penalty=0.5))
    assert len(law) == 4**3 and math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    # (1, 1, 2): z = T[0]; then T[1] - 0.5 * [0, 1, 0, 0]; then T[1] - 0.5 * [0, 2, 0, 0]
    p = (E / (1 + E + E**2 + 1)) * (E**1.5 / (E + E**1.5 + 1 + E**-1)) * (1 / (E + E + 1 + E**-1))
    assert law[(1, 1, 2)] == pytest.approx(p, rel=1e-12)
    # (2, 0, 2): z = T[0]; then T[2] - 0.5 * [0, 0, 1, 0] = [2, 0, .5, 0]; then T[0] - 0.5 * [1, 0, 1, 0]
    p = (E**2 / (2 + E + E**2)) * (E**2 / (E**2 + 2 + E**0.5)) * (E**1.5 / (E**-0.5 + E + E**1.5 + 1))
    assert law[(2, 0, 2)] == pytest.approx(p, rel=1e-12)
    # the penalty is on the generated tokens only: the first position is the plain softmax of T[0]
    assert math.fsum(v for s, v in law.items() if s[0] == 3) == pytest.approx(1 / (2 + E + E**2), rel=1e-12)


@pytest.mark.parametrize(
    "config, prompt, prefix, expected_z",
    [
        # T[1] = [1, 2, 0, -1]. Bias before repetition: token 0 is 1 - 0.5 = 0.5 > 0, so divided (not
        # 1 / 2 - 0.5 = 0); token 3 is -1 + 1 = 0, so multiplied (not -1 * 2 + 1 = -1); token 2 is unseen
        (SamplingConfig(logit_bias={0: -0.5, 3: 1.0}, repetition_penalty=2.0), [0], (3, 1), [0.25, 1.0, 0.0, 0.0]),
        # presence and frequency count generated tokens only (token 1 twice, prompt token 3 not at all)
        (SamplingConfig(presence_penalty=0.25, frequency_penalty=0.5), [3], (1, 1), [1.0, 0.75, 0.0, -1.0]),
        # repetition on prompt and generated tokens alike; then presence on the generated one only
        (SamplingConfig(repetition_penalty=4.0, presence_penalty=1.0), [2], (0, 1), [-0.75, -0.5, 0.0, -1.0]),
    ],
    ids=["bias-then-repetition", "presence-frequency", "repetition-prompt-and-generated"],
)
def test_processed_logits_by_hand(config, prompt, prefix, expected_z):
    z = processed_logits64(MODEL, prompt, [prefix], config)[0].tolist()
    assert z == pytest.approx(expected_z, abs=1e-15)
    p = next_token_law(MODEL, prompt, [prefix], config)[0]
    assert p.tolist() == pytest.approx([softmax_at(expected_z, v) for v in range(4)], rel=1e-12)


def test_law_is_the_product_of_per_step_laws_on_each_prefix():
    """Brute force: every leaf is the product of the per-step warped probabilities on its own prefix; EOS stops."""
    automaton = TokenAutomaton(((1, 0, 0, -1), (0, 1, -1, 0)))  # state 1 (after token 0) forbids 2, state 0 forbids EOS
    config = SamplingConfig(temperature=0.8, top_k=3, repetition_penalty=1.5, presence_penalty=0.3,
                            frequency_penalty=0.2, logit_bias={2: -0.5}, min_new_tokens=1, constraint=automaton)
    prompt, n = [2, 1], 3

    def leaves(prefix: tuple) -> dict:
        if len(prefix) == n or prefix[-1:] == (EOS,):
            return {prefix: 1.0}
        z = history_row(TABLE[([*prompt, *prefix])[-1]], config, prompt, prefix, EOS)
        step = warp(torch.tensor(z), config, dtype=torch.float64).tolist()
        return {s: step[t] * q for t in range(4) if step[t] > 0 for s, q in leaves(prefix + (t,)).items()}

    expected = leaves(())
    law = continuation_law(MODEL, prompt, n, config, eos_id=EOS)
    assert set(law) == set(expected) and any(s[-1] == EOS and len(s) < n for s in law)
    assert all(law[s] == pytest.approx(expected[s], rel=1e-12) for s in law)
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------- structural properties


def test_greedy_follows_the_penalised_argmax():
    # after [1]: argmax 1 (z = 2); then 1 is penalised to 2 - 1.5 = 0.5 < 1, so 0; after 0, argmax 2
    law = continuation_law(MODEL, [1], 3, SamplingConfig(greedy=True, frequency_penalty=1.5))
    assert law == {(1, 0, 2): 1.0}
    assert continuation_law(MODEL, [1], 3, SamplingConfig(greedy=True)) == {(1, 1, 1): 1.0}


def test_min_new_tokens_masks_eos_before_position_two():
    config = SamplingConfig(min_new_tokens=2)
    law = continuation_law(MODEL, [3], 3, config, eos_id=EOS)
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert not [s for s in law if EOS in s[:2]]
    assert math.fsum(p for s, p in law.items() if s[-1] == EOS) > 0.05  # EOS is allowed at position 2
    assert continuation_law(MODEL, [3], 3, SamplingConfig(), eos_id=EOS)[(EOS,)] == pytest.approx(0.25)
    # without an EOS id nothing is masked
    assert continuation_law(MODEL, [3], 1, config) == continuation_law(MODEL, [3], 1, SamplingConfig())


def test_several_eos_ids_all_stop_and_are_all_masked_by_min_new_tokens():
    eos = (EOS, 2)
    law = continuation_law(MODEL, [3], 3, SamplingConfig(), eos_id=eos)
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert law[(2,)] == pytest.approx(0.25) and law[(EOS,)] == pytest.approx(0.25)  # row 3 is uniform
    assert not [s for s in law if any(t in eos for t in s[:-1])]  # nothing after either EOS
    masked = continuation_law(MODEL, [3], 3, SamplingConfig(min_new_tokens=2), eos_id=eos)
    assert not [s for s in masked if any(t in eos for t in s[:2])]
    assert {s[-1] for s in masked if len(s) == 3} >= {2, EOS}  # both allowed at position 2
    z = history_row(TABLE[3], SamplingConfig(min_new_tokens=1), [3], [], eos_id=eos)
    assert z[2] == z[EOS] == -math.inf and z[0] == z[1] == 0.0


def test_constraint_gives_zero_mass_to_forbidden_sequences():
    # state 0 allows {0, 1} (0 -> state 1); state 1 allows {2, 3} (back to state 0); the prompt is not read
    automaton = TokenAutomaton(((1, 0, -1, -1), (-1, -1, 0, 0)))
    config = SamplingConfig(temperature=1.3, constraint=automaton)
    law = continuation_law(MODEL, [2, 3], 3, config)

    def accepted(seq):
        state = 0
        for t in seq:
            state = automaton.transitions[state][t]
            if state < 0:
                return False
        return True

    allowed = {s for s in itertools.product(range(4), repeat=3) if accepted(s)}
    assert set(law) == allowed and math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    # (0, 2, 1): T[3] = 0 over {0, 1}; T[0] / 1.3 over {2, 3} = {2 / 1.3, 0}; T[2] / 1.3 over {0, 1} = {2 / 1.3, 0}
    a = E ** (2 / 1.3)
    assert law[(0, 2, 1)] == pytest.approx(0.5 * (a / (a + 1)) * (1 / (a + 1)), rel=1e-12)


def test_no_allowed_token_is_an_error():
    only_eos = TokenAutomaton(((-1, -1, -1, 0),))
    with pytest.raises(ValueError, match="no token is allowed"):
        continuation_law(MODEL, [0], 1, SamplingConfig(min_new_tokens=1, constraint=only_eos), eos_id=EOS)


def test_repetition_penalty_on_the_prompt_changes_the_first_position():
    plain = continuation_law(MODEL, [2, 0], 1, SamplingConfig())
    penalised = continuation_law(MODEL, [2, 0], 1, SamplingConfig(repetition_penalty=2.0))
    # T[0] = [0, 1, 2, 0]; tokens 0 and 2 are in the prompt: z = [0 * 2, 1, 2 / 2, 0]
    assert penalised[(2,)] == pytest.approx(E / (1 + E + E + 1), rel=1e-12)
    assert plain[(2,)] == pytest.approx(E**2 / (2 + E + E**2), rel=1e-12)


def test_the_oracle_does_not_import_the_implementation():
    root = Path(__file__).resolve().parents[1] / "properties"
    for name in ("history_law.py", "sequences.py"):
        tree = ast.parse((root / name).read_text())
        modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not [m for m in modules if m.startswith("specdec_ref.history")], name


# --------------------------------------------------------------------------- margins and ties


def test_boundary_margin_measures_processed_logits():
    # T[1] = [1, 2, 0, -1]: the raw top-2 gap is 1; a bias of 0.999 on token 0 leaves 0.001
    raw = boundary_margin(MODEL, [1], 1, SamplingConfig(greedy=True))
    biased = boundary_margin(MODEL, [1], 1, SamplingConfig(greedy=True, logit_bias={0: 0.999}))
    assert raw.logit_gap == pytest.approx(1.0) and biased.logit_gap == pytest.approx(0.001)
    # a constraint leaving one token: nothing to flip
    one = TokenAutomaton(((-1, 0, -1, -1),))
    assert boundary_margin(MODEL, [1], 2, SamplingConfig(greedy=True, constraint=one)).logit_gap == math.inf
    assert raw.min_p_gap == math.inf


def test_boundary_margin_reports_the_min_p_threshold():
    # T[1] = [1, 2, 0, -1] at temperature 2: x = [.5, 1, 0, -.5]; min_p = e^-0.5 puts the threshold at x = 0.5
    on_edge = SamplingConfig(temperature=2.0, min_p=math.exp(-0.5))
    m = boundary_margin(MODEL, [1], 1, on_edge)
    assert m.min_p_gap < 1e-12 and m.where_min_p == ()
    with pytest.raises(AssertionError, match="min-p threshold gap"):
        m.assert_safe(torch.float32)
    off_edge = boundary_margin(MODEL, [1], 1, SamplingConfig(temperature=2.0, min_p=math.exp(-0.75)))
    assert off_edge.min_p_gap == pytest.approx(2.0 * 0.25)  # pre-temperature units: x distance 0.25 times T
    off_edge.assert_safe(torch.float32)
    # the min-p gap is measured on processed logits: a bias moves token 0 off the threshold
    moved = boundary_margin(MODEL, [1], 1, SamplingConfig(temperature=2.0, min_p=math.exp(-0.5), logit_bias={0: 0.5}))
    assert moved.min_p_gap == pytest.approx(0.5)


def test_split_ties_sees_ties_made_by_the_history_steps():
    table = Order1([[2.0, 1.0, 0.0, -5.0]] * 4)
    assert not split_ties(table, [0], 1, SamplingConfig(top_p=0.3), eos_id=None)
    # a bias of 1 on token 1 ties it with token 0 at 2; a top-p of 0.3 keeps only one of them
    tied = SamplingConfig(top_p=0.3, logit_bias={1: 1.0})
    (line,) = split_ties(table, [0], 1, tied, eos_id=None)
    assert "same logit 2" in line
    # a repetition penalty on token 0 (in the prompt) breaks the tie again
    assert not split_ties(table, [0], 1, SamplingConfig(top_p=0.3, logit_bias={1: 1.0}, repetition_penalty=1.5), eos_id=None)


# --------------------------------------------------------------------------- agreement with the implementation


@st.composite
def automata(draw, vocab: int, eos: tuple[int, ...]):
    """A random automaton over ``vocab`` tokens in which every state allows some token that is not an EOS id."""
    states = draw(st.integers(1, 3))
    rows = []
    for _ in range(states):
        row = draw(st.lists(st.integers(-1, states - 1), min_size=vocab, max_size=vocab))
        keep = draw(st.sampled_from([v for v in range(vocab) if v not in eos]))
        row[keep] = max(row[keep], 0)
        rows.append(tuple(row))
    return TokenAutomaton(tuple(rows), start=draw(st.integers(0, states - 1)))


@st.composite
def history_configs(draw, vocab: int, eos: tuple[int, ...]):
    """Random settings: every history step on or off, greedy or sampling with random filters."""
    small = st.floats(-1.5, 1.5, allow_nan=False)
    return SamplingConfig(
        greedy=draw(st.booleans()),
        temperature=draw(st.sampled_from([0.6, 1.0, 1.7])),
        top_k=draw(st.none() | st.integers(1, vocab)),
        top_p=draw(st.none() | st.floats(0.3, 0.95)),
        min_p=draw(st.none() | st.floats(0.02, 0.6)),
        repetition_penalty=draw(st.sampled_from([1.0, 0.7, 1.3, 2.0])),
        presence_penalty=draw(st.sampled_from([0.0]) | small),
        frequency_penalty=draw(st.sampled_from([0.0]) | small),
        logit_bias=draw(st.dictionaries(st.integers(0, vocab - 1), st.floats(-3, 3, allow_nan=False), max_size=3)),
        min_new_tokens=draw(st.integers(0, 3)),
        constraint=draw(st.none() | automata(vocab, eos)),
        bad_words=draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=2, max_size=3), max_size=2)),
    )


SAFE = {"logit": 1e-3, "mass": 1e-4, "min_p": 1e-3}  # float32 vs float64 cannot disagree on a support this far from a cut


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_oracle_agrees_with_the_implementation(data):
    vocab = data.draw(st.integers(3, 6), label="V")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="table seed"))
    model = Order1(rng.normal(0.0, 2.0, (vocab, vocab)))
    eos_ids = tuple(data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=2, unique=True), label="eos ids"))
    eos = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    config = data.draw(history_configs(vocab, eos_ids), label="config")
    try:  # a constraint whose product with the bad words leaves a state without tokens is refused at once
        automaton_of(config.constraint, config.bad_words, vocab)
    except ValueError:
        reject()
    prompt = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4), label="prompt")
    n = data.draw(st.integers(1, 4), label="n")
    # a random prefix of positive probability (not through EOS: generation would stop there)
    prefix: list[int] = []
    while len(prefix) < n - 1:
        try:
            p = next_token_law(model, prompt, [prefix], config, eos_id=eos)[0]
        except ValueError as exc:  # bad words and min_new_tokens together left no token: the oracle says so
            assert "no token is allowed" in str(exc), exc
            reject()
        choices = [v for v in range(vocab) if p[v] > 0 and v not in eos_ids]
        if not choices:
            break
        prefix.append(int(rng.choice(choices)))
    n = len(prefix) + 1
    histories = [tuple(prefix[:i]) for i in range(n)]
    z64 = processed_logits64(model, prompt, histories, config, eos_id=eos)
    margins = row_margins(z64, config)
    assume(all(bool((margins[k] > SAFE[k]).all()) for k in SAFE))
    oracle = next_token_law(model, prompt, histories, config, eos_id=eos)
    logits = model.next_logits([prompt + list(h) for h in histories]).to(torch.float32)[None]  # [1, n, V]

    def implementation(state, tokens, rows):
        got = warp_rows(logits[:, rows], [config], state, torch.tensor([tokens], dtype=torch.long))[0]
        if config.greedy:  # greedy rows are the softmax of the processed logits; the choice is their argmax
            processed = process_logits(logits[:, rows], [config], state, torch.tensor([tokens], dtype=torch.long))[0]
            assert torch.equal(processed.argmax(-1), oracle[rows].argmax(-1)), (processed, z64[rows])
            return got, torch.softmax(z64[rows], -1)
        return got, oracle[rows]

    # the whole prefix as a block (m = n rows aligned to the end of n - 1 tokens)
    got, want = implementation(SamplingState([prompt], [config], [eos], vocab, "cpu"), prefix, slice(0, n))
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=0), (config, prompt, prefix, got, want)
    # after committing the first k tokens (plus one rejected draft that must not count), the rest as a block
    k = data.draw(st.integers(0, n - 1), label="committed")
    state = SamplingState([prompt], [config], [eos], vocab, "cpu")
    rejected = data.draw(st.integers(0, vocab - 1), label="rejected draft")
    state.commit(torch.tensor([prefix[:k] + [rejected]], dtype=torch.long), torch.tensor([k]))
    got, want = implementation(state, prefix[k:], slice(k, n))
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=0), (config, prompt, prefix, k, got, want)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    rep=st.sampled_from([1.0, 1.5, 0.7]), presence=st.sampled_from([0.0, 0.3]), frequency=st.sampled_from([0.0, 0.2]),
    bias=st.sampled_from([{}, {2: -0.5}, {0: 1.0, 1: -2.0}]), min_new=st.integers(0, 2), constrained=st.booleans(),
    prompt=st.lists(st.integers(0, 3), min_size=1, max_size=4),
    prefixes=st.lists(st.lists(st.integers(0, 2), max_size=4), min_size=1, max_size=6),
    eos=st.sampled_from([None, EOS, (EOS, 2)]),
)
def test_history_logits_is_history_row_on_every_row(rep, presence, frequency, bias, min_new, constrained, prompt, prefixes, eos):
    """The all-rows form gives every row bit for bit what :func:`history_row` gives it alone (or the same error)."""
    automaton = TokenAutomaton(((1, 0, 0, -1), (0, 1, -1, 0))) if constrained else None
    config = SamplingConfig(repetition_penalty=rep, presence_penalty=presence, frequency_penalty=frequency,
                            logit_bias=bias, min_new_tokens=min_new, constraint=automaton)
    raw = np.array([TABLE[([*prompt, *p])[-1]] for p in prefixes], dtype=np.float64)
    try:
        expected = np.stack([history_row(row, config, prompt, p, eos) for row, p in zip(raw, prefixes)])
    except ValueError as exc:
        with pytest.raises(ValueError, match=str(exc).split("(")[0].split(" after")[0]):
            history_logits(raw, config, prompt, prefixes, eos)
        return
    got = history_logits(raw, config, prompt, prefixes, eos)
    assert np.array_equal(got, expected)
