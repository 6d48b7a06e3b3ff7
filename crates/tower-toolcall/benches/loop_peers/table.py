#!/usr/bin/env python3
"""Scores loop detectors on the labelled corpus from their per-trace outcomes.

Usage: python3 table.py [--corpus DIR] [--by-family] NAME=OUTCOMES.jsonl ...

Each outcome file has one JSON line per corpus trace: {"id": ..., "stoppedAt": n | null},
n being the index of the first call the detector refused. Per detector:

- loops stopped in time: stoppedAt within [earliestStop, latestStop];
- missed: a loop never stopped, or stopped after latestStop (shown as "late" too);
- false stops: a productive trace stopped at all, plus a loop stopped before earliestStop;
- median calls past earliestStop: over the loops stopped at or after earliestStop.

Standard library only.
"""

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))


def load_corpus(path):
    traces = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".json"):
            with open(os.path.join(path, name)) as f:
                for t in json.load(f):
                    traces[t["id"]] = t
    if not traces:
        sys.exit(f"no traces under {path}")
    return traces


def load_outcomes(path, traces):
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("id") not in traces:
                sys.exit(f"{path}:{n}: unknown trace id {row.get('id')!r}")
            stop = row.get("stoppedAt")
            if stop is not None and not (isinstance(stop, int) and 0 <= stop < len(traces[row["id"]]["calls"])):
                sys.exit(f"{path}:{n}: stoppedAt {stop!r} is not a call index of {row['id']}")
            out[row["id"]] = stop
    missing = sorted(set(traces) - set(out))
    if missing:
        sys.exit(f"{path}: no outcome for {len(missing)} traces, e.g. {missing[:3]}")
    return out


def score(traces, outcomes, ids):
    s = defaultdict(int)
    past = []
    for i in ids:
        t, stop = traces[i], outcomes[i]
        if t["label"] == "loop":
            s["loops"] += 1
            e, l = t["earliestStop"], t["latestStop"]
            if stop is None:
                s["missed"] += 1
            elif stop < e:
                s["early"] += 1
            elif stop <= l:
                s["in_time"] += 1
                past.append(stop - e)
            else:
                s["missed"] += 1
                s["late"] += 1
                past.append(stop - e)
        else:
            s["productive"] += 1
            if stop is not None:
                s["false_productive"] += 1
    s["median_past"] = statistics.median(past) if past else None
    return s


def pct(a, b):
    return f"{100 * a / b:.0f} %" if b else "-"


def row(name, s):
    med = "-" if s["median_past"] is None else f"{s['median_past']:g}"
    false = s["false_productive"] + s["early"]
    return (f"| {name} | {s['in_time']} / {s['loops']} ({pct(s['in_time'], s['loops'])}) | {s['missed']} ({s['late']} late) "
            f"| {s['false_productive']} / {s['productive']} ({pct(s['false_productive'], s['productive'])}) | {s['early']} | {false} | {med} |")


HEADER = ("| detector | loops stopped in time | missed | productive falsely stopped | loops stopped too early | false stops | median calls past earliest stop |\n"
          "|---|---:|---:|---:|---:|---:|---:|")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=os.path.join(HERE, "..", "..", "tests", "loop_detect", "corpus"))
    ap.add_argument("--by-family", action="store_true", help="one table per family as well")
    ap.add_argument("outcomes", nargs="+", metavar="NAME=FILE")
    a = ap.parse_args()
    traces = load_corpus(a.corpus)
    runs = []
    for spec in a.outcomes:
        name, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"expected NAME=FILE, got {spec!r}")
        runs.append((name, load_outcomes(path, traces)))
    loops = sum(t["label"] == "loop" for t in traces.values())
    print(f"Corpus: {len(traces)} traces, {loops} loops, {len(traces) - loops} productive.\n")
    print(HEADER)
    for name, out in runs:
        print(row(name, score(traces, out, traces)))
    if a.by_family:
        families = sorted({t["family"] for t in traces.values()})
        for fam in families:
            ids = [i for i, t in traces.items() if t["family"] == fam]
            print(f"\n**{fam}** ({len(ids)} traces)\n")
            print(HEADER)
            for name, out in runs:
                print(row(name, score(traces, out, ids)))


if __name__ == "__main__":
    main()
