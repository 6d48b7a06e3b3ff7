#!/usr/bin/env python3
"""Prints the medians criterion measured for one group, and each one's overhead over a
baseline in the same group: python3 crates/tower-toolcall/benches/medians.py <group> (from the workspace root) [baseline]"""
import json
import pathlib
import sys

group = sys.argv[1]
baseline = sys.argv[2] if len(sys.argv) > 2 else "bare"
# Criterion names a group's folder with its slashes replaced.
root = pathlib.Path("target/criterion") / group.replace("/", "_")
medians = {}
for estimates in sorted(root.glob("*/new/estimates.json")):
    name = estimates.parent.parent.name
    medians[name] = json.loads(estimates.read_text())["median"]["point_estimate"]
if not medians:
    sys.exit(f"no measurements under {root}: run `cargo bench -p <package> --bench ...` first")
base = medians.get(baseline)
print(f"| {group} | median | over {baseline} |")
print("|---|---:|---:|")
for name, ns in medians.items():
    over = "" if base is None or name == baseline else f"{ns - base:+.0f} ns"
    print(f"| {name} | {ns:.0f} ns | {over} |")
