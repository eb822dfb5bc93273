"""``python -m conformance.calibration``: the calibration tables of the README and docs/statistics.md.

False alarms of the reference verifier at the ``ci`` profile's looks (the interim look and the early-pass looks,
each rejecting at ``INTERIM_ALPHA_SCALE`` times alpha), the power table and the early-pass table; the machinery is
:mod:`specdec_properties.calibration` (which imports nothing of ``conformance``: the profile is passed in from here).
"""
from __future__ import annotations

import argparse

from specdec_properties.calibration import ALPHA, STAT_SCENARIOS, early_pass_table, false_alarms, power_table, \
    summarise_false_alarms

from .profiles import INTERIM_ALPHA_SCALE, get_profile


def main(argv=None) -> None:
    from specdec_ref.backend import reference_backend

    from specdec_properties.sample_size import required_blocks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    profile = get_profile("ci")
    fractions = (profile.interim_fraction, *profile.early_pass_fractions)
    summary = summarise_false_alarms(false_alarms(reference_backend(), seeds=args.seeds, blocks=args.blocks,
                                                  interim_fractions=fractions), INTERIM_ALPHA_SCALE)
    print(f"False alarms: reference verifier, balanced scenario, {args.seeds} seeds x {args.blocks} blocks, "
          f"{summary['tests']} chi-square tests")
    print("| alpha | failures | expected |")
    print("|---|---|---|")
    print(f"| {ALPHA:g} | {summary['failures_at_alpha']} | {summary['expected_failures_at_alpha']:.3f} |")
    print(f"| 0.01 | {summary['failures_at_0.01']} | {summary['expected_at_0.01']:.1f} |")
    print(f"| 0.05 | {summary['failures_at_0.05']} | {summary['expected_at_0.05']:.1f} |")
    print(f"smallest Kolmogorov-Smirnov p-value of p-value uniformity over {len(summary['ks_pvalues'])} tests: {summary['min_ks_pvalue']:.3g}")
    looks = summary.get("earlier_looks", 0)
    if looks:
        print(f"\nWith the looks before the full one (the interim look and the early-pass looks, on the first "
              f"{', '.join(f'{f:g}' for f in fractions)} of each seed's blocks, each rejecting at alpha x "
              f"{INTERIM_ALPHA_SCALE:g}), failures of any look:")
        print("| alpha (full look) | failures | at most expected |")
        print("|---|---|---|")
        for level in (ALPHA, 0.01, 0.05):
            print(f"| {level:g} | {summary[f'all_looks_at_{level:g}']} | "
                  f"{summary['tests'] * level * (1 + looks * INTERIM_ALPHA_SCALE):.3g} |")
        print(f"p-values at the earlier looks: smallest Kolmogorov-Smirnov p-value {summary['interim_ks_min']:.3g}")
        print("power: the earlier looks only add rejections, so the full look's stated power (below) is a lower bound")
    n = required_blocks(STAT_SCENARIOS["balanced"])
    print(f"\nPower: first-token test at the ci profile's N = {n}, alpha = {ALPHA:g}, {args.repeats} repeats")
    print("| TV | biased sampler | stated power (lower bound) | detection rate |")
    print("|---|---|---|---|")
    for row in power_table(n, repeats=args.repeats):
        print(f"| {row['tv']:g} | {row['direction']} | {row['stated_power']:.4f} | {row['detection_rate']:.3f} |")
    looks = get_profile("ci").early_pass_fractions
    if looks:
        rows = early_pass_table(n, looks, repeats=args.repeats)
        print(f"\nWith the early-pass looks (at {', '.join(f'{f:g}' for f in looks)} of the sample, each a prefix of the same "
              f"draws; otherwise the full look on {rows[0]['n_full']}), worst-case sampler, {args.repeats} repeats (TV 0: the "
              "exact law)")
        print("| TV | passed early | mean share of N drawn | stated power (lower bound) | detection rate |")
        print("|---|---|---|---|---|")
        for row in rows:
            stated = "none stated" if row["stated_power"] is None else f"{row['stated_power']:.4f}"
            print(f"| {row['tv']:g} | {row['passed_early']:.3f} | {row['mean_share_drawn']:.3f} | {stated} | {row['detection_rate']:.3f} |")


if __name__ == "__main__":
    main()
