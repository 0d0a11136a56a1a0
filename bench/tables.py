#!/usr/bin/env python3
"""Prints the markdown tables of docs/BENCHMARKS.md from one sitting's JSON files
(bench/run-all.sh output). Usage: bench/tables.py [DIR] (default docs/bench-results)."""
import json
import os
import sys

DIR = sys.argv[1] if len(sys.argv) > 1 else "docs/bench-results"
TARGETS = ["lode", "lode-native", "tmpfs", "disk", "bindfs", "moosefs"]
GROUPS = {
    "md-easy1": ["File creation", "File stat", "File removal",
                 "Directory creation", "Directory stat", "Directory removal"],
    "md-easy2": ["File creation", "File stat", "File removal",
                 "Directory creation", "Directory stat", "Directory removal"],
    "md-hard2": ["File creation", "File stat", "File read", "File removal"],
    "walk": None,
    "io": None,
}


def load(name):
    path = os.path.join(DIR, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return {p["name"]: p for p in json.load(f)["phases"]}


def main():
    got = {}
    for group, cols in GROUPS.items():
        rows = [(t, load(f"{group}-{t}")) for t in TARGETS]
        rows = [(t, r) for t, r in rows if r]
        if not rows:
            continue
        cols = cols or list(rows[0][1].keys())
        got[group] = dict(rows)
        print(f"### {group}\n")
        print("| target | " + " | ".join(cols) + " |")
        print("|---|" + "---:|" * len(cols))
        for t, r in rows:
            cells = [f"{r[c]['mean']:,.0f}" if c in r else "–" for c in cols]
            print(f"| {t} | " + " | ".join(cells) + " |")
        print()
    easy2 = got.get("md-easy2", {})
    hard2 = got.get("md-hard2", {})
    if "lode" in easy2 and "moosefs" in easy2:
        print("### lode mount / MooseFS, same sitting\n")
        print("| run | phase | lode | MooseFS | ratio |")
        print("|---|---|---:|---:|---:|")
        for group, data in (("md easy, 2 clients", easy2), ("md hard, 2 clients", hard2)):
            if "lode" not in data or "moosefs" not in data:
                continue
            for phase, p in data["lode"].items():
                m = data["moosefs"].get(phase)
                if m and m["mean"] > 0 and phase not in ("Tree creation", "Tree removal"):
                    print(f"| {group} | {phase} | {p['mean']:,.0f} | {m['mean']:,.0f} | "
                          f"{p['mean'] / m['mean']:.2f} |")
        print()
    n8 = load("md-native8-lode-native")
    if n8:
        print("### one native client, 8 threads\n")
        print("| phase | ops/s | p50 µs | p99 µs | max µs |")
        print("|---|---:|---:|---:|---:|")
        for phase, p in n8.items():
            print(f"| {phase} | {p['mean']:,.0f} | {p['p50_us']:,.0f} | {p['p99_us']:,.0f} | "
                  f"{p['max_us']:,.0f} |")
        print()


if __name__ == "__main__":
    main()
