"""``python -m conformance.engines.calibration``: the black-box tool's planned looks, measured on the matrix's cases.

Files of the engine matrix's sampling cases (:data:`conformance.engines.matrix.CASES`), drawn from the exact law of
each case (a correct engine) or from a law at a stated TV from it (a biased one), are certified at the cases' planned
looks (:func:`conformance.engines.waves.case_looks`), as the engine runner certifies an engine's waves. Measured: the
false alarms of correct files at several alphas (the whole procedure, every look rejecting at its share of that alpha),
the looks correct files pass at and the share of N they read, and the detection rate and N read of biased files.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from specdec_properties.calibration import worst_direction
from specdec_properties.sequences import continuation_law
from specdec_ref.exact import exact_model

__all__ = ["case_law", "draw_lines", "certify_file", "calibrate", "main"]


def case_law(case) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The exact law of a case's completions: ``(continuations, probabilities)`` (EOS-ended ones shorter)."""
    em = exact_model(case.model)
    law = continuation_law(em, list(case.prompt), case.max_new_tokens, case.sampling,
                           eos_id=int(em.eos_id) if case.eos else None)
    keys = list(law.keys())
    p = np.array([float(law[k]) for k in keys])
    return keys, p / p.sum()


def draw_lines(case, n: int, seed: int, tv: float = 0.0) -> list[dict]:
    """``n`` lines of a case in request order: the exact law, or (``tv`` > 0) the law at TV ``tv`` from it that the
    chi-square test sees least (:func:`specdec_properties.calibration.worst_direction`, over whole continuations)."""
    keys, p = case_law(case)
    law = worst_direction(p, tv) if tv > 0 else p
    picks = np.random.default_rng(seed).choice(len(keys), size=n, p=law / law.sum())
    return [{"prompt_ids": list(case.prompt), "completion_ids": list(keys[i]), "seed": case.seed(j)}
            for j, i in enumerate(picks)]


def certify_file(case, seed: int, alpha: float, tv: float = 0.0) -> dict:
    """One file of ``case`` certified at its planned looks: its outcome, the look that decided and the lines read."""
    from conformance.samples import certify_samples

    from .waves import case_looks

    looks = case_looks(case)
    lines = draw_lines(case, looks.full_n, seed, tv)
    v = certify_samples(lines, model=case.model, sampling=case.sampling, max_new_tokens=case.max_new_tokens,
                        eos_id=True if case.eos else None, alpha=alpha, looks=looks)
    return {"case": case.name, "seed": seed, "alpha": alpha, "tv": tv, "level": v.level, "n": v.n,
            "look": v.sequential.deciding.kind if v.sequential.deciding else None, "nominal_n": looks.nominal_n,
            "family_alpha": looks.family_alpha(alpha)}


def _one(job):
    from .matrix import case

    name, seed, alpha, tv = job
    return certify_file(case(name), seed, alpha, tv)


def calibrate(*, seeds: int, alphas=(1e-6, 0.01, 0.05), tvs=(0.03,), first_seed: int = 50_000, jobs: int = 1,
              cases=None) -> list[dict]:
    """Every (case, seed, alpha) of correct files and every (case, seed, tv) of biased ones at alpha 1e-6."""
    from .matrix import CASES

    names = [c.name for c in CASES if not c.greedy and (cases is None or c.name in cases)]
    work = [(n, first_seed + s, a, 0.0) for a in alphas for n in names for s in range(seeds)]
    work += [(n, first_seed + s, 1e-6, tv) for tv in tvs for n in names for s in range(seeds)]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return list(pool.map(_one, work, chunksize=4))
    return [_one(w) for w in work]


def tables(rows: list[dict]) -> str:
    """The Markdown tables of :func:`calibrate`'s rows."""
    out = []
    exact = [r for r in rows if r["tv"] == 0]
    out += ["| alpha (per file) | files | false alarms | at most expected (family-wise alpha x files) |", "|---|---|---|---|"]
    for a in sorted({r["alpha"] for r in exact}):
        sel = [r for r in exact if r["alpha"] == a]
        fails = sum(r["level"] == "not_certified" for r in sel)
        out.append(f"| {a:g} | {len(sel)} | {fails} | {sum(r['family_alpha'] for r in sel):.3g} |")
    base = [r for r in exact if r["alpha"] == 1e-6]
    if base:
        out += ["", "Correct files at alpha 1e-6, per case: where they were decided and the share of the nominal N read",
                "", "| case | files | interim | early pass | full | mean share of N read | verdicts |", "|---|---|---|---|---|---|---|"]
        for name in dict.fromkeys(r["case"] for r in base):
            sel = [r for r in base if r["case"] == name]
            looks = {k: sum(r["look"] == k for r in sel) for k in ("interim", "early_pass", "full")}
            share = np.mean([r["n"] / r["nominal_n"] for r in sel])
            levels = ", ".join(f"{lv} {sum(r['level'] == lv for r in sel)}" for lv in sorted({r["level"] for r in sel}))
            out.append(f"| {name} | {len(sel)} | {looks['interim']} | {looks['early_pass']} | {looks['full']} | "
                       f"{share:.3f} | {levels} |")
        out.append(f"| all | {len(base)} | | | | {np.mean([r['n'] / r['nominal_n'] for r in base]):.3f} | |")
    biased = [r for r in rows if r["tv"] > 0]
    for tv in sorted({r["tv"] for r in biased}):
        sel = [r for r in biased if r["tv"] == tv]
        out += ["", f"Biased files (TV {tv:g}, the direction the chi-square test sees least), alpha 1e-6", "",
                "| case | files | detected | mean share of N read | rejected at interim / early / full |", "|---|---|---|---|---|"]
        for name in dict.fromkeys(r["case"] for r in sel):
            rs = [r for r in sel if r["case"] == name]
            det = [r for r in rs if r["level"] == "not_certified"]
            out.append(f"| {name} | {len(rs)} | {len(det)} | {np.mean([r['n'] / r['nominal_n'] for r in rs]):.3f} | "
                       + " / ".join(str(sum(r["look"] == k for r in det)) for k in ("interim", "early_pass", "full")) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m conformance.engines.calibration", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cases", default="", help="only these matrix cases (comma-separated)")
    ap.add_argument("--json", default="", help="also write every file's outcome here")
    args = ap.parse_args(argv)
    rows = calibrate(seeds=args.seeds, jobs=args.jobs, cases=args.cases.split(",") if args.cases else None)
    if args.json:
        import json

        with open(args.json, "w") as fh:
            json.dump(rows, fh)
    print(tables(rows))


if __name__ == "__main__":
    main()
