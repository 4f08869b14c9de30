"""Before/after of loaderx's own rows across bench.py JSON reports.

    python scripts/bench_compare.py --after 'a_*.json' --before 'b_*.json'

Reads every report matching each glob (`bench.py LAYER --json FILE`, one per
run, the two trees' runs alternating), takes each loaderx row's gather MiB/s
median over the runs of each side, and prints after/before per row and their
geometric mean per layer section. Contenders are left out: this compares a
library with itself (issue 23's "no regression" check); the reports' own
tables compare it with the others.
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
from typing import Dict, List, Tuple

Key = Tuple[str, str]


def loaderx_rows(paths: List[str]) -> Dict[Key, List[float]]:
    """(section key, row name) -> gather MiB/s of each report, loaderx rows that ran."""
    rows: Dict[Key, List[float]] = {}
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for section in report["sections"]:
            for row in section["rows"]:
                value = row.get("gather_mib_s")
                if row.get("group") == "loaderx" and row.get("status") == "ok" and value:
                    rows.setdefault((section["key"], row["name"]), []).append(float(value))
    return rows


def compare(after: List[str], before: List[str]) -> List[Tuple[str, str, float, float, float]]:
    """(section, row, after median, before median, ratio) for rows on both sides."""
    a, b = loaderx_rows(after), loaderx_rows(before)
    out = []
    for key in a:
        if key in b:
            ma, mb = statistics.median(a[key]), statistics.median(b[key])
            out.append((key[0], key[1], ma, mb, ma / mb))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--after", required=True, help="glob of the after reports")
    parser.add_argument("--before", required=True, help="glob of the before reports")
    args = parser.parse_args()
    after, before = sorted(glob.glob(args.after)), sorted(glob.glob(args.before))
    if not after or not before:
        parser.error("each glob must match at least one report")
    rows = compare(after, before)
    print(f"{len(after)} after and {len(before)} before reports; gather MiB/s medians")
    for section in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == section]
        for _, name, ma, mb, ratio in mine:
            print(f"  {section:14s} {name[:64]:64s} {ma:10.1f} {mb:10.1f} {ratio:6.2f}x")
        mean = statistics.geometric_mean([r[4] for r in mine])
        print(f"  {section:14s} {'geometric mean':64s} {'':10s} {'':10s} {mean:6.2f}x")


if __name__ == "__main__":
    main()
