"""The OpenVINO GenAI matrix's speculative completions against the mechanism of :mod:`conformance.engines.openvino.model`.

    python -m conformance.engines.openvino.check --check OUT     # OUT: a `python -m conformance.engines openvino` folder

Per checked (configuration, case): per seed, whether the engine's first tokens are the model's; and as laws, the first
2 and 3 tokens against the model's law (a two-sample test) and against the exact law. Exit 0 when the engine follows
the mechanism. Split from the model itself (the sampler re-implemented) so that each module has one job.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from .model import Settings, Stream, speculative, table_logits, top_k_heap

__all__ = ["check", "main", "CHECKED"]


def _two_sample(a: Counter, b: Counter) -> tuple[float, int, float]:
    """Chi-square of homogeneity of two samples' cell counts (cells expected below 5 pooled): (statistic, df, p)."""
    from scipy.stats import chi2

    na, nb = sum(a.values()), sum(b.values())
    cells = sorted(set(a) | set(b))
    big, rest = [], [0, 0]
    for x in cells:
        tot = a[x] + b[x]
        if min(tot * na, tot * nb) / (na + nb) >= 5:
            big.append((a[x], b[x]))
        else:
            rest[0] += a[x]
            rest[1] += b[x]
    if rest[0] + rest[1]:
        big.append(tuple(rest))
    stat = 0.0
    for x, y in big:
        tot = x + y
        for obs, n in ((x, na), (y, nb)):
            e = tot * n / (na + nb)
            stat += (obs - e) ** 2 / e
    df = max(len(big) - 1, 1)
    return stat, df, float(chi2.sf(stat, df))


def _goodness(a: Counter, law: dict) -> tuple[float, int, float]:
    """Chi-square of a sample against a law (cells expected below 5 pooled; an impossible cell counts in full)."""
    from scipy.stats import chi2

    n = sum(a.values())
    stat, df, rest_o, rest_e = 0.0, -1, 0, 0.0
    for x in sorted(set(a) | set(law)):
        e = law.get(x, 0.0) * n
        if e >= 5:
            stat += (a[x] - e) ** 2 / e
            df += 1
        else:
            rest_o += a[x]
            rest_e += e
    if rest_o or rest_e:
        stat += (rest_o - rest_e) ** 2 / max(rest_e, 1e-9)
        df += 1
    return stat, max(df, 1), float(chi2.sf(stat, max(df, 1)))


#: The matrix outputs the stage checks against the model: (configuration, case).
CHECKED = (("draft-k3-nopc", "warp"), ("draft-same-nopc", "warp"))


def check(out: str, which=CHECKED, *, alpha: float = 1e-6) -> list[dict]:
    """The engine's completions in a matrix output folder against the mechanism: per seed (the model on each
    record's own seed) and as a law (the model on as many other seeds), the first 2 tokens (what the model
    defines on every request) and the first 3; beside it the exact law's chi-square. ``passed``: the 2-token law
    of the engine is the model's (p >= alpha) and at least 99.9% of the requests have the model's first 2 tokens
    (the rest: an exact tie ``q(x) = p(y)`` at ``r = 1``, decided by the last bit of the engine's float32
    ``exp(log p)``)."""
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model, exact_pair

    from ..matrix import case as get_case
    from .adapter import ADAPTER

    rows = []
    for cfg_name, case_name in which:
        cfg, c = ADAPTER.config(cfg_name), get_case(case_name)
        pair = exact_pair(cfg.options.get("pair") or ADAPTER.families[c.family])
        path = Path(out) / "raw" / cfg_name / c.family / f"{case_name}.jsonl"
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        T, D = table_logits(pair.target.name), table_logits(pair.draft.name)
        s, eos = Settings.of(c.sampling), (int(pair.target.eos_id) if c.eos else None)
        k = ADAPTER.k_of(cfg)
        run = lambda sd: speculative(T, D, c.prompt, s, c.max_new_tokens, sd, k, eos_id=eos)
        same2 = same = 0
        for r in recs:
            m = run(r["seed"])
            same2 += r["completion_ids"][:2] == m[:2]
            same += r["completion_ids"] == m
        row = {"config": cfg_name, "case": case_name, "n": len(recs), "per_seed_first2": same2, "per_seed_whole": same}
        em = exact_model(pair.target.name)
        for length in (2, 3):
            cut = lambda ids: " ".join(map(str, _cut(ids, length, eos)))
            eng = Counter(cut(r["completion_ids"]) for r in recs)
            mod = Counter(cut(run(10**8 + i)) for i in range(len(recs)))
            law = continuation_law(em, list(c.prompt), length, ADAPTER.conventions.sampling(c.sampling), eos_id=eos)
            law = {" ".join(map(str, key)): float(v) for key, v in law.items()}
            row[f"model_L{length}"] = _two_sample(eng, mod)
            row[f"exact_L{length}"] = _goodness(eng, law)
        row["passed"] = row["model_L2"][2] >= alpha and same2 >= 0.999 * len(recs)
        rows.append(row)
    return rows


def _cut(ids, length, eos):
    out = []
    for t in ids[:length]:
        out.append(t)
        if eos is not None and t == eos:
            break
    return out


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m conformance.engines.openvino.check", description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="OUT", help="a matrix output folder of `python -m conformance.engines openvino`")
    args = ap.parse_args(argv)
    if not args.check:
        _selftest()
        return 0
    ok = True
    for r in check(args.check):
        f = lambda t: f"chi-square {t[0]:.1f} on {t[1]} df, p {t[2]:.3g}"
        print(f"{r['config']} / {r['case']} (N {r['n']}): per seed, first 2 tokens = the model's on "
              f"{r['per_seed_first2']}, whole completion on {r['per_seed_whole']}")
        for length in (2, 3):
            print(f"    first {length} tokens: vs the model's law {f(r[f'model_L{length}'])}; "
                  f"vs the exact law {f(r[f'exact_L{length}'])}")
        ok &= r["passed"]
    print("the engine follows the mechanism" if ok else "MECHANISM MISMATCH: the engine departs from the model")
    return 0 if ok else 1


def _selftest() -> None:  # pragma: no cover - a quick look: python -m conformance.engines.openvino.check
    st = Stream(5489)
    assert st.u32() == 3499211612, "std::mt19937(5489)'s first output"
    print("mt19937 ok;", "heap keeps", sorted(i for _, i in top_k_heap(np.array([1.0, 1.0, 2.0]), 2)),
          "of logits [1, 1, 2] at k = 2 (the lowest-ids rule keeps [0, 2])")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
