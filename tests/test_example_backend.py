"""The README's worked example (examples/numpy_backend.py) stays short and certifiable."""
from pathlib import Path

from conformance.backends import load_backend
from conformance.registry import CheckContext, all_cases, run_case
from examples.numpy_backend import factory
from specdec_ref.contract import Capabilities, Verifier

EXAMPLE = Path(__file__).parent.parent / "examples" / "numpy_backend.py"


def test_example_is_under_50_lines():
    assert len(EXAMPLE.read_text().splitlines()) <= 50


def test_example_declares_exactly_what_it_implements():
    backend = load_backend("examples.numpy_backend:factory")  # runs specdec_ref.contract.check_backend
    assert isinstance(backend, Verifier)
    assert backend.capabilities == Capabilities(verifier=True, greedy=True, sampling=True, batched=True)


def test_example_passes_deterministic_and_statistical_checks():
    backend = factory()
    names = ["structure_sampling", "structure_greedy", "greedy_valid_path", "sampling_seeded_reproducible",
             "sampling_accepted_length_law"]
    records = [run_case(c, backend, CheckContext(profile="dev")) for c in all_cases(names)]
    assert records and all(r.status == "passed" for r in records), [(r.id, r.message[:300]) for r in records]
