"""The certificate's pictures (conformance.report_plots): one per failed statistical test, linked from the Markdown;
a lossy scheme's distances; without matplotlib the certificate is complete and says why there are none."""
from __future__ import annotations

import json
import sys

import pytest

from conformance.registry import CheckContext, all_cases, run_case
from conformance.report import certificate_for_records, write_certificate
from specdec_fixtures.mutants import MUTANTS
from specdec_ref.backend import reference_backend, typical_backend

PNG = b"\x89PNG\r\n\x1a\n"


def _records(backend, names, case_ids=None):
    cases = [c for c in all_cases(names) if case_ids is None or c.case_id in case_ids]
    return [run_case(c, backend, CheckContext(profile="ci")) for c in cases]


@pytest.fixture(scope="module")
def failing():
    """A chi-square failure (rejected at the interim look) and a failed total test (rejected at an early-pass look, at
    1/100 of its alpha), one backend each."""
    chi = _records(MUTANTS["resample_from_p"].backend(), ["sampling_first_token_follows_row0"], ["balanced"])
    total = _records(MUTANTS["draft_filters_before_temperature"].backend(), ["decoder_acceptance_under_filters"], ["hot"])
    assert [r.status for r in chi + total] == ["failed", "failed"], [r.message[:500] for r in chi + total]
    return chi, total


def test_a_failed_chi_square_record_carries_its_cells(failing):
    chi, _ = failing
    (test,) = chi[0].interim_statistics
    assert test["passed"] is False and 0 < len(test["cells"]) <= 40
    label, observed, expected, z = test["cells"][0]
    assert isinstance(label, str) and observed >= 0 and expected > 0 and abs(z) > 3


def test_a_failed_total_is_recorded_even_though_the_check_never_recorded_it(failing):
    _, total = failing
    (test,) = [r for r in total[0].statistics + total[0].interim_statistics if not r["passed"]]
    assert test["passed"] is False and test["std"] > 0 and test["unit"] == "accepted drafts"


def test_the_markdown_shows_a_plot_per_failed_statistical_check(failing, tmp_path):
    chi, total = failing
    for records, backend in ((chi, MUTANTS["resample_from_p"].backend()), (total, MUTANTS["draft_filters_before_temperature"].backend())):
        cert = certificate_for_records(records, backend=backend)
        path = tmp_path / f"{records[0].check}.json"
        md = write_certificate(str(path), cert)
        text = open(md).read()
        (check,) = [r.id for r in records]
        assert "## Plots" in text and f"**`{check}`**" in text
        links = [line[line.index("](") + 2: -1] for line in text.splitlines() if line.startswith("![")]
        assert len(links) == 1
        assert (tmp_path / links[0]).read_bytes()[:8] == PNG
        assert json.loads(path.read_text())["verdict"]["headline"].startswith("NOT CERTIFIED")


def test_a_lossy_certificate_plots_its_measured_distances(tmp_path):
    backend = typical_backend()
    records = _records(backend, ["sampling_sequence_law_over_rounds"])
    cert = certificate_for_records(records, backend=backend, profile="ci")
    assert cert["verdict"]["headline"].startswith("LOSSY"), cert["verdict"]
    text = open(write_certificate(str(tmp_path / "c.json"), cert)).read()
    assert "![measured distances](c-plots/lossy-distances.png)" in text
    assert (tmp_path / "c-plots" / "lossy-distances.png").read_bytes()[:8] == PNG


def test_a_passing_certificate_has_no_plots(tmp_path):
    backend = reference_backend()
    records = _records(backend, ["sampling_first_token_follows_row0"], ["balanced"])
    text = open(write_certificate(str(tmp_path / "c.json"), certificate_for_records(records, backend=backend))).read()
    assert "## Plots" not in text and not (tmp_path / "c-plots").exists()


def test_without_matplotlib_the_certificate_says_why_it_has_no_plots(failing, tmp_path, monkeypatch):
    chi, _ = failing
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    cert = certificate_for_records(chi, backend=MUTANTS["resample_from_p"].backend())
    text = open(write_certificate(str(tmp_path / "c.json"), cert)).read()
    assert 'Not drawn: the certificate\'s plots need matplotlib: pip install -e ".[plots]"' in text
    assert (tmp_path / "c.json").exists()
