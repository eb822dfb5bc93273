"""SGLang's tree kernels (pure-PyTorch ports), the layout adapter and the SGLang mutants (specdec_ref/adapters/sglang.py).

* the ports reproduce sgl-kernel's own unit tests (``sgl-kernel/tests/speculative/test_speculative_sampling.py``,
  ``test_eagle_utils.py``) bit for bit;
* the layout conversion round-trips chains, stars, k-ary and random trees, padded rows in one batch;
* greedy through the adapter equals :class:`DeterministicTreeVerifier` exactly; sampling at thresholds (1, 1)
  follows the deterministic scheme's exact law of (accepted path, final token) (chi-square, N and alpha stated
  by ``specdec_properties.stats``), the reference on the same trees too;
* thresholds below 1 accept more (numbers in the test); every mutant is caught here at unit level;
* bad input raises ValueError.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, note

from conformance.backends import load_backend
from specdec_fixtures.mutants import MUTANTS as ALL_MUTANTS
from specdec_fixtures.mutants import sglang as sglang_mutants
from specdec_properties.stats import assert_fits, goodness_of_fit
from specdec_properties.strategies import tree_blocks
from specdec_ref.contract import check_backend
from specdec_ref.adapters.sglang import (
    LOSSY_THRESHOLDS,
    SGLangTreeBackend,
    TreeSpeculativeSamplingTargetOnly,
    VerifyTreeGreedy,
    empty_sglang_outputs,
    from_sglang_layout,
    from_sglang_outputs,
    sglang_lossy_backend,
    sglang_port_backend,
    to_sglang_layout,
    tree_speculative_sampling_target_only,
    verify_tree_greedy,
)
from specdec_ref.tree import DeterministicTreeVerifier

ROOT = Path(__file__).resolve().parents[1]
SUITE_CHECKS = {"tree_structure_sampling", "tree_sampling_path_law", "tree_sampling_sequence_law_over_rounds"}


# ----------------------------------------------------------------------------- helpers


def padded_batch(trees: list[list[int]], vocab: int, seed: int = 0):
    """Rows of different trees padded to the largest: (draft_tokens, parents, target_probs), distinct sibling tokens."""
    rng = np.random.default_rng(seed)
    width = max(len(t) for t in trees)
    tokens = np.full((len(trees), width), -1)
    parents = np.full((len(trees), width), -1)
    for b, tree in enumerate(trees):
        parents[b, : len(tree)] = tree
        for slot in range(-1, len(tree)):
            kids = [i for i, p in enumerate(tree) if p == slot]
            tokens[b, kids] = rng.choice(vocab, size=len(kids), replace=False)
    target = rng.dirichlet(np.ones(vocab), size=(len(trees), width + 1))
    return torch.tensor(tokens), torch.tensor(parents), torch.tensor(target, dtype=torch.float32)


def random_tree(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(rng.integers(-1, i)) for i in range(n)]


def kary(width: int, depth: int) -> list[int]:
    parents, previous, start = [], [-1], 0
    for _ in range(depth):
        nodes = [p for p in previous for _ in range(width)]
        parents += nodes
        previous = list(range(start, start + len(nodes)))
        start += len(nodes)
    return parents


SHAPES = {
    "chain": [-1, 0, 1, 2, 3],
    "star": [-1, -1, -1, -1],
    "kary": kary(2, 3),
    "random": random_tree(11, seed=3),
    "single": [-1],
}


def exact_law(tokens: list[int], parents: list[int], target: np.ndarray) -> dict:
    """The deterministic scheme's exact law of (accepted path, final token) given the tree (distinct sibling tokens):
    child ``x`` of the node the walk stands on is accepted with probability ``p(x)`` (sequential one-hot
    acceptance), the final token is ``p`` without the children's tokens (its own row at a leaf)."""
    law: dict = {}

    def visit(node: int, prob: float, path: tuple) -> None:
        row = target[node + 1]
        kids = [i for i, t in enumerate(tokens) if t >= 0 and parents[i] == node]
        for i in kids:
            visit(i, prob * row[tokens[i]], path + (i,))
        taken = {tokens[i] for i in kids}
        for y, mass in enumerate(row):
            if y not in taken and mass > 0:
                law[(path, y)] = law.get((path, y), 0.0) + prob * mass

    visit(-1, 1.0, ())
    return law


def outcomes(result) -> Counter:
    m, path, tokens = result
    return Counter((tuple(p[:k]), t[k]) for k, p, t in zip(m.tolist(), path.tolist(), tokens.tolist()))


def replicate(tokens, parents, target, rows: int):
    """One tree replicated over ``rows`` batch rows (one call: every row an independent trial)."""
    vocab = target.shape[-1]
    n = tokens.shape[-1]
    return (
        tokens.reshape(1, n).expand(rows, n).clone(),
        parents.reshape(1, n).expand(rows, n).clone(),
        torch.full((rows, n, vocab), 1.0 / vocab),
        target.reshape(1, n + 1, vocab).expand(rows, n + 1, vocab).clone(),
    )


def law_fit(backend, tokens, parents, target, *, rows: int, seed: int, what: str):
    """Chi-square of ``backend``'s (path, final token) counts against :func:`exact_law` (outcomes outside it: impossible)."""
    law = exact_law(tokens.tolist(), parents.tolist(), target.double().numpy())
    run = backend.verify_tree if hasattr(backend, "verify_tree") else backend
    counts = outcomes(run(*replicate(tokens, parents, target, rows), generator=torch.Generator().manual_seed(seed)))
    labels = list(law)
    other = sum(c for k, c in counts.items() if k not in law)
    return goodness_of_fit(
        [counts[k] for k in labels] + [other],
        [law[k] for k in labels] + [0.0],
        what=what,
        labels=[str(k) for k in labels] + ["outside the law"],
        seed=seed,
    )


def structure_violations(result, draft_tokens, parents) -> int:
    """Rows whose path is not a root-to-node path of their tree or whose tokens do not match it."""
    m, path, tokens = result
    bad = 0
    n = draft_tokens.shape[1]
    for b in range(draft_tokens.shape[0]):
        k, p, t = int(m[b]), path[b].tolist(), tokens[b].tolist()
        ok = 0 <= k <= n and t[k] >= 0 and all(x == -1 for x in p[k:]) and all(x == -1 for x in t[k + 1 :])
        previous = -1
        for j in range(min(k, n)):
            node = p[j]
            ok &= 0 <= node < n and int(draft_tokens[b, node]) >= 0 and int(parents[b, node]) == previous
            ok &= 0 <= node < n and t[j] == int(draft_tokens[b, node])
            previous = node
        bad += not ok
    return bad


# ----------------------------------------------------------------------------- sgl-kernel's own cases


def sgl_kernel_case():
    """The tree, links and target logits of sgl-kernel's tests (two rows, six nodes, V = 20, temperature 0.01)."""
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    retrive_index = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    next_token = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    next_sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    logits = torch.full((2, 6, 20), 1.0)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = logits[1, 0, 11] = logits[1, 4, 12] = 10
    for i in range(2):
        for j in range(6):
            if logits[i, j].max() < 10:
                logits[i, j, 18] = 10
    return candidates, retrive_index, next_token, next_sibling, logits


@pytest.mark.parametrize(
    "thresholds, predicts, accept_index, accept_token_num",
    [
        ((1, 1), [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
        ((0, 0), [1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18], [[0, 1, 2, -1], [6, 10, 11, -1]], [2, 2]),
    ],
)
def test_sampling_port_reproduces_sgl_kernel_unit_test(thresholds, predicts, accept_index, accept_token_num):
    candidates, retrive_index, next_token, next_sibling, logits = sgl_kernel_case()
    target_probs = torch.softmax(logits / 0.01, -1)
    out = empty_sglang_outputs(2, 6, 4)
    draft_probs = torch.zeros_like(target_probs)
    g = torch.Generator().manual_seed(0)
    tree_speculative_sampling_target_only(
        predicts=out.predicts,
        accept_index=out.accept_index,
        accept_token_num=out.accept_token_num,
        candidates=candidates,
        retrive_index=retrive_index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        uniform_samples=torch.rand(2, 6, generator=g),
        uniform_samples_for_final_sampling=torch.rand(2, generator=g),
        target_probs=target_probs,
        draft_probs=draft_probs,
        threshold_single=thresholds[0],
        threshold_acc=thresholds[1],
        deterministic=True,
    )
    assert out.predicts.tolist() == predicts
    assert out.accept_index.tolist() == accept_index
    assert out.accept_token_num.tolist() == accept_token_num
    assert out.predicts.dtype == out.accept_index.dtype == out.accept_token_num.dtype == torch.int32


def test_greedy_port_reproduces_sgl_kernel_unit_test():
    candidates, retrive_index, next_token, next_sibling, logits = sgl_kernel_case()
    out = empty_sglang_outputs(2, 6, 4)
    verify_tree_greedy(*out, candidates, retrive_index, next_token, next_sibling, logits.argmax(-1))
    assert out.predicts.tolist() == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
    assert out.accept_index.tolist() == [[0, 3, 4, 5], [6, 10, 11, -1]]
    assert out.accept_token_num.tolist() == [3, 2]


def test_rejected_children_are_written_into_draft_probs_and_removed_from_the_final_sample():
    """Root children tokens 0 and 1 (target mass 0.45 each): with coin 1 both are rejected (prob_acc = 0.9);
    the kernel writes their mass into draft_probs and the final token is the only other one, 2."""
    candidates = torch.tensor([[9, 0, 1]])
    target = torch.tensor([[[0.45, 0.45, 0.10], [1 / 3] * 3, [1 / 3] * 3]])
    out = empty_sglang_outputs(1, 3, 3)
    draft_probs = torch.zeros_like(target)
    tree_speculative_sampling_target_only(
        *out, candidates, torch.tensor([[0, 1, 2]]), torch.tensor([[1, -1, -1]]), torch.tensor([[-1, 2, -1]]),
        torch.ones(1, 3), torch.tensor([0.0]), target, draft_probs,
    )
    assert out.accept_token_num.tolist() == [0] and out.accept_index.tolist() == [[0, -1, -1]]
    assert out.predicts.tolist() == [2, -1, -1]
    assert draft_probs[0, 0].tolist() == pytest.approx([0.45, 0.45, 0.0])


# ----------------------------------------------------------------------------- layout


def check_layout(draft_tokens, parents, layout):
    batch, n = draft_tokens.shape
    size = n + 1
    assert layout.candidates.shape == (batch, size) and layout.num_speculative_tokens == size
    assert layout.retrive_index.tolist() == [[b * size + j for j in range(size)] for b in range(batch)]
    nt, ns = layout.retrive_next_token.tolist(), layout.retrive_next_sibling.tolist()
    for b in range(batch):
        real = [i for i in range(n) if draft_tokens[b, i] >= 0]
        pointed = Counter(x for x in nt[b] + ns[b] if x >= 0)
        for i in range(n):
            j = i + 1
            if i in real:
                assert layout.candidates[b, j] == draft_tokens[b, i]
                assert pointed[j] == 1, "every real node is linked exactly once"
                kids = [c + 1 for c in real if parents[b, c] == i]
                assert nt[b][j] == (kids[0] if kids else -1)
                brothers = [c + 1 for c in real if parents[b, c] == parents[b, i]]
                later = [x for x in brothers if x > j]
                assert ns[b][j] == (later[0] if later else -1), "siblings linked in index order"
            else:
                assert pointed[j] == 0 and nt[b][j] == -1 and ns[b][j] == -1, "padding is unreachable"
        roots = [c + 1 for c in real if parents[b, c] == -1]
        assert nt[b][0] == roots[0] and ns[b][0] == -1
    tokens_back, parents_back = from_sglang_layout(layout.candidates, layout.retrive_next_token, layout.retrive_next_sibling)
    assert tokens_back.tolist() == draft_tokens.tolist()
    real = draft_tokens >= 0
    assert torch.equal(torch.where(real, parents_back, -1), torch.where(real, parents.long(), -1))


def test_layout_round_trip_on_every_tree_kind_padded_in_one_batch():
    draft_tokens, parents, target = padded_batch(list(SHAPES.values()), vocab=8)
    layout = to_sglang_layout(draft_tokens, parents, target, root_tokens=torch.tensor([7, 6, 5, 4, 3]))
    assert layout.candidates[:, 0].tolist() == [7, 6, 5, 4, 3]
    assert torch.equal(layout.target_probs, target) and layout.target_probs.dtype == torch.float32
    check_layout(draft_tokens, parents, layout)


@given(block=tree_blocks(greedy=True))
def test_layout_round_trip_on_drawn_trees(block):
    note(block.describe())
    check_layout(block.draft_tokens, block.parents, to_sglang_layout(block.draft_tokens, block.parents, block.target_probs))


def test_outputs_map_back_to_paths_and_tokens():
    """sgl-kernel's greedy case read back through from_sglang_outputs (row 0: nodes 3, 4, 5 = ours 2, 3, 4)."""
    candidates, retrive_index, next_token, next_sibling, logits = sgl_kernel_case()
    out = empty_sglang_outputs(2, 6, 4)
    verify_tree_greedy(*out, candidates, retrive_index, next_token, next_sibling, logits.argmax(-1))
    m, path, tokens = from_sglang_outputs(*out, retrive_index)
    assert m.tolist() == [3, 2]
    assert path.tolist() == [[2, 3, 4, -1, -1], [3, 4, -1, -1, -1]]
    assert tokens.tolist() == [[3, 4, 5, 18, -1, -1], [11, 12, 18, -1, -1, -1]]


def test_outputs_keep_garbage_visible():
    """An accept_index that names no node of its row maps to path -1 (not to some valid-looking node)."""
    retrive_index = torch.tensor([[0, 1, 2]])
    m, path, tokens = from_sglang_outputs(
        torch.tensor([5, 6, 7]), torch.tensor([[0, 99, -1]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32), retrive_index
    )
    assert m.tolist() == [1] and path.tolist() == [[-1, -1]] and tokens.tolist() == [[5, -1, -1]]


# ----------------------------------------------------------------------------- port vs reference


@given(block=tree_blocks(greedy=True))
def test_greedy_equals_the_deterministic_reference_exactly(block):
    """Same first-index argmax on both sides, so equal even on exact ties."""
    note(block.describe())
    expected = DeterministicTreeVerifier()(block.draft_tokens, block.parents, None, block.target_probs)
    got = sglang_port_backend().verify_tree(block.draft_tokens, block.parents, None, block.target_probs)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


@given(block=tree_blocks(greedy=False))
def test_sampled_paths_are_paths_of_their_trees(block):
    """Up to 64 nodes, rows of different trees padded in one batch: every row's path is a root-to-node path
    with its tokens, at thresholds (1, 1) and below."""
    note(block.describe())
    for backend in (sglang_port_backend(), sglang_lossy_backend()):
        result = backend.verify_tree(block.draft_tokens, block.parents, block.draft_probs, block.target_probs, generator=torch.Generator().manual_seed(0))
        assert structure_violations(result, block.draft_tokens, block.parents) == 0


LAW_TREES = {  # (parents, vocab): small trees, distinct sibling tokens
    "star3": ([-1, -1, -1], 5),
    "chain3": ([-1, 0, 1], 4),
    "mixed": ([-1, -1, 0, 0, 1, 2], 6),
    "kary2x2": (kary(2, 2), 8),
}


@pytest.mark.parametrize("name", list(LAW_TREES))
def test_sampling_follows_the_deterministic_law_at_thresholds_1_1(name):
    """Per-level coin with cumulative sums (SGLang) and per-sibling coins (reference) give one law of
    (accepted path, final token): both fit the exact law (40k replicated rows, alpha 1e-6)."""
    parents, vocab = LAW_TREES[name]
    tokens, parents_t, target = padded_batch([parents], vocab, seed=len(name))
    for backend, seed in ((sglang_port_backend(), 11), (DeterministicTreeVerifier(), 12)):
        result = law_fit(backend, tokens[0], parents_t[0], target[0], rows=40_000, seed=seed, what=f"{name} {type(backend).__name__}")
        assert result.passed, result.report()


def test_thresholds_below_1_accept_more():
    """Tree kary(2, 2), every target row [0.4, 0.3, 0.2, 0.1], children tokens 0 and 1 at every level.
    Exact (1, 1): a level accepts with 0.4 + 0.3 = 0.7, E[m] = 0.7 + 0.7^2 = 1.19.
    (0.5, 0.5): child 0 passes when coin <= 0.8, child 1 when coin <= 1.4: always, so m = 2 on every row."""
    tokens = torch.tensor([0, 1, 0, 1, 0, 1])
    parents = torch.tensor(kary(2, 2))
    target = torch.tensor([0.4, 0.3, 0.2, 0.1]).expand(7, 4).clone()
    law = exact_law(tokens.tolist(), parents.tolist(), target.double().numpy())
    exact_mean = sum(len(path) * prob for (path, _), prob in law.items())
    assert exact_mean == pytest.approx(1.19)
    rows = 20_000
    args = replicate(tokens, parents, target, rows)
    m_exact = sglang_port_backend().verify_tree(*args, generator=torch.Generator().manual_seed(0))[0].double()
    m_lossy = sglang_lossy_backend().verify_tree(*args, generator=torch.Generator().manual_seed(0))[0].double()
    sd = float((sum(len(p) ** 2 * q for (p, _), q in law.items()) - exact_mean**2) ** 0.5)
    assert abs(m_exact.mean().item() - exact_mean) < 5 * sd / rows**0.5
    assert m_lossy.mean().item() == 2.0
    assert LOSSY_THRESHOLDS == (0.5, 0.5)


def test_adapter_draws_only_from_the_generator_and_reproduces():
    draft_tokens, parents, target = padded_batch(list(SHAPES.values()), vocab=8, seed=5)
    q = torch.full(draft_tokens.shape + (8,), 1 / 8)
    backend = sglang_port_backend()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = backend.verify_tree(draft_tokens, parents, q, target, generator=torch.Generator().manual_seed(9))
    assert torch.equal(torch.get_rng_state(), state), "the global RNG was read"
    second = backend.verify_tree(draft_tokens, parents, q, target, generator=torch.Generator().manual_seed(9))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert structure_violations(first, draft_tokens, parents) == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_reach_the_kernel_as_float32(dtype):
    draft_tokens, parents, target = padded_batch([SHAPES["kary"], SHAPES["chain"]], vocab=6, seed=2)
    target = target.to(dtype)
    target = target / target.sum(-1, keepdim=True)
    result = sglang_port_backend().verify_tree(draft_tokens, parents, torch.full(draft_tokens.shape + (6,), 1 / 6, dtype=dtype), target, generator=torch.Generator().manual_seed(1))
    assert structure_violations(result, draft_tokens, parents) == 0


# ----------------------------------------------------------------------------- any kernel behind the adapter


def test_kernel_with_newer_sgl_kernel_signature_is_called_correctly():
    """Newer sgl_kernel spells ``retrieve_*`` and has no ``draft_probs``: the adapter fits its call to the
    signature, and the same coins give the same answer as the port."""
    port = TreeSpeculativeSamplingTargetOnly()
    seen = {}

    def newer(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
              uniform_samples, uniform_samples_for_final_sampling, target_probs, threshold_single=1.0, threshold_acc=1.0, deterministic=True):
        seen["called"] = True
        port(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
             uniform_samples, uniform_samples_for_final_sampling, target_probs, None, threshold_single, threshold_acc, deterministic)

    draft_tokens, parents, target = padded_batch(list(SHAPES.values()), vocab=8, seed=7)
    q = torch.full(draft_tokens.shape + (8,), 1 / 8)
    expected = sglang_port_backend().verify_tree(draft_tokens, parents, q, target, generator=torch.Generator().manual_seed(4))
    got = SGLangTreeBackend(sampling_kernel=newer).verify_tree(draft_tokens, parents, q, target, generator=torch.Generator().manual_seed(4))
    assert seen["called"] and all(torch.equal(a, b) for a, b in zip(expected, got))


def test_docs_factory_example_runs():
    """The wrapping example of docs/sglang.md, executed as written (with the port standing in for sgl_kernel)."""
    text = (ROOT / "docs" / "sglang.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code.replace("from sgl_kernel import", "from specdec_ref.adapters.sglang import"), "docs/sglang.md", "exec"), namespace)
    backend = namespace["sgl_kernel_backend"]()
    check_backend(backend)
    assert backend.capabilities.tree_scheme == "deterministic" and backend.capabilities.devices == ("cuda",)
    draft_tokens, parents, target = padded_batch([SHAPES["kary"]], vocab=6)
    assert structure_violations(backend.verify_tree(draft_tokens, parents, None, target), draft_tokens, parents) == 0


def test_declared_capabilities():
    port, lossy = sglang_port_backend(), sglang_lossy_backend()
    for backend in (port, lossy):
        check_backend(backend)
        caps = backend.capabilities
        assert caps.tree and caps.greedy and caps.sampling and caps.batched and not caps.verifier and not caps.decoder
    assert port.capabilities.tree_scheme == "deterministic" and port.capabilities.tree_lossless
    assert lossy.capabilities.tree_scheme == "lossy" and not lossy.capabilities.tree_lossless
    assert SGLangTreeBackend(threshold_acc=0.9).capabilities.tree_scheme == "lossy"
    assert not SGLangTreeBackend(batched=False).capabilities.batched
    assert lossy.name != port.name and "0.5" in lossy.name
    assert load_backend("specdec_ref.adapters.sglang:sglang_port_backend").capabilities.tree_scheme == "deterministic"


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_value_error():
    draft_tokens, parents, target = padded_batch([SHAPES["kary"]], vocab=6)
    backend = sglang_port_backend()
    for bad in (
        lambda: SGLangTreeBackend(threshold_single=1.5),
        lambda: SGLangTreeBackend(threshold_acc=-0.1),
        lambda: SGLangTreeBackend(sampling_kernel=42),
        lambda: backend.verify_tree(draft_tokens, parents, None, target[:, :-1]),  # target rows n, not n + 1
        lambda: backend.verify_tree(draft_tokens, torch.full_like(parents, 5), None, target),  # not topological
        lambda: backend.verify_tree(torch.tensor([[-1, 2]]), torch.tensor([[-1, -1]]), None, target[:, :3]),  # padding first
        lambda: backend.verify_tree(draft_tokens + 100, parents, None, target),  # token outside V
        lambda: to_sglang_layout(draft_tokens, torch.full_like(parents, 5), None),
        lambda: to_sglang_layout(draft_tokens, parents, target, num_speculative_tokens=0),
    ):
        with pytest.raises(ValueError):
            bad()
    candidates, retrive_index, next_token, next_sibling, logits = sgl_kernel_case()
    probs = torch.softmax(logits, -1)
    out = empty_sglang_outputs(2, 6, 4)
    with pytest.raises(ValueError, match="uniform_samples"):
        tree_speculative_sampling_target_only(*out, candidates, retrive_index, next_token, next_sibling, torch.rand(2, 5), torch.rand(2), probs)
    with pytest.raises(ValueError, match="threshold_acc"):
        tree_speculative_sampling_target_only(*out, candidates, retrive_index, next_token, next_sibling, torch.rand(2, 6), torch.rand(2), probs, None, 1.0, 2.0)
    with pytest.raises(ValueError, match="retrive_next_sibling"):
        verify_tree_greedy(*out, candidates, retrive_index, next_token, next_sibling[:, :5], logits.argmax(-1))
    with pytest.raises(ValueError, match="target_predict"):
        VerifyTreeGreedy()(*out, candidates, retrive_index, next_token, next_sibling, logits.argmax(-1)[:1])


# ----------------------------------------------------------------------------- mutants


def test_sglang_mutants_are_registered():
    assert sglang_mutants.MUTANTS and {"sglang_next_token_sibling_swapped", "sglang_lossy_declared_exact"} <= set(sglang_mutants.MUTANTS)
    for name, mutant in sglang_mutants.MUTANTS.items():
        assert name.startswith("sglang_") and mutant.kind == "sglang" and ALL_MUTANTS[name] is mutant
        assert mutant.bug and set(mutant.must_fail) <= SUITE_CHECKS and mutant.must_fail
        backend = load_backend(mutant.spec)  # the factory, through check_backend
        assert backend.name == f"mutant.{name}"
    assert sglang_mutants.MUTANTS["sglang_lossy_declared_exact"].backend().capabilities.tree_scheme == "deterministic"


def test_swapped_links_differ_from_the_port_on_a_tree_with_siblings():
    """Greedy, root children [3, 1], the target's choice 1: the port accepts node 1, the swapped walk never
    leaves the root (the root has no sibling) and emits token 1 as a 'replacement'."""
    draft_tokens, parents = torch.tensor([[3, 1, 2]]), torch.tensor([[-1, -1, 1]])
    target = torch.full((1, 4, 5), 0.1)
    target[0, 0, 1] = target[0, 1, 0] = target[0, 2, 2] = target[0, 3, 4] = 0.6
    swapped = sglang_mutants.MUTANTS["sglang_next_token_sibling_swapped"].backend()
    port = sglang_port_backend().verify_tree(draft_tokens, parents, None, target)
    mutant = swapped.verify_tree(draft_tokens, parents, None, target)
    assert port.num_accepted.tolist() == [2] and port.tokens.tolist() == [[1, 2, 4, -1]]
    assert mutant.num_accepted.tolist() == [0] and mutant.tokens.tolist() == [[1, -1, -1, -1]]


@pytest.mark.parametrize("name", list(sglang_mutants.MUTANTS))
def test_every_sglang_mutant_is_caught_at_unit_level(name):
    """What its must_fail check will see: invalid paths (structure) or a (path, final token) law off the exact
    one on the 'mixed' tree (40k rows; the port passes the same fit in the law test above)."""
    mutant = sglang_mutants.MUTANTS[name]
    backend = mutant.backend()
    parents, vocab = LAW_TREES["mixed"]
    tokens, parents_t, target = padded_batch([parents], vocab, seed=len("mixed"))
    if "tree_structure_sampling" in mutant.must_fail:
        args = replicate(tokens[0], parents_t[0], target[0], 2_000)
        result = backend.verify_tree(*args, generator=torch.Generator().manual_seed(0))
        assert structure_violations(result, args[0], args[1]) > 0
    else:
        result = law_fit(backend, tokens[0], parents_t[0], target[0], rows=40_000, seed=13, what=name)
        assert not result.passed, f"{name} fits the exact law: {result.headline()}"


def test_law_fit_helper_reports_n_alpha_and_power():
    """The law checks above go through specdec_properties.stats (N, alpha, power stated)."""
    parents, vocab = LAW_TREES["star3"]
    tokens, parents_t, target = padded_batch([parents], vocab, seed=5)
    result = law_fit(sglang_port_backend(), tokens[0], parents_t[0], target[0], rows=40_000, seed=1, what="star3")
    assert result.n == 40_000 and result.alpha == 1e-6 and 0 < result.power <= 1
    assert_fits(result.observed, result.expected, what="star3 again", labels=result.labels)
