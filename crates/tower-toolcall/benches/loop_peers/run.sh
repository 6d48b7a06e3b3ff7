#!/usr/bin/env bash
# Replays the loop corpus (tests/loop_detect/corpus) through the loop detectors other
# agents ship, and prints the comparison table. Not run by CI.
#
#   benches/loop_peers/run.sh            # install (once), replay, print the table
#
# Installs pinned versions into benches/loop_peers/.venv (Python >= 3.12 for openhands-sdk;
# set PYTHON to choose the interpreter) and benches/loop_peers/node_modules (Node >= 20).
# Writes out/<detector>.jsonl, one {"id", "stoppedAt"} line per trace. The crate's own
# outcomes are included when out/crate.jsonl exists; the crate's replay test writes it:
#
#   LOOP_CORPUS_OUT=$PWD/benches/loop_peers/out/crate.jsonl \
#     cargo test --all-features --test loop_detect corpus
set -euo pipefail
cd "$(dirname "$0")"

OPENHANDS_SDK_VERSION=1.58.2
CLINE_CORE_VERSION=0.0.86
CORPUS=../../tests/loop_detect/corpus
mkdir -p out

find_python() {
  for p in ${PYTHON:-} python3.13 python3.12 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  echo "openhands-sdk needs Python >= 3.12; set PYTHON to one" >&2
  exit 1
}

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
if [ "$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("openhands-sdk"))' 2>/dev/null)" != "$OPENHANDS_SDK_VERSION" ]; then
  .venv/bin/pip install --quiet "openhands-sdk==$OPENHANDS_SDK_VERSION"
fi
npm install --no-package-lock --no-audit --no-fund --loglevel=error
# @cline/core is optional (it asks for Node >= 22; its trackers run on 20): left out if it
# does not install. Not in package.json, so the install above removes it again.
npm install --no-save --no-package-lock --no-audit --no-fund --loglevel=error "@cline/core@$CLINE_CORE_VERSION" \
  || echo "@cline/core did not install: Cline is left out" >&2

versions() { node -p "require('./node_modules/$1/package.json').version" 2>/dev/null || echo "not installed"; }
echo "openhands-sdk $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("openhands-sdk"))')" >&2
echo "@google/gemini-cli-core $(versions @google/gemini-cli-core)" >&2
echo "@cline/core $(versions @cline/core)" >&2

.venv/bin/python openhands_replay.py "$CORPUS" out/openhands.jsonl
node gemini.mjs "$CORPUS" out/gemini.jsonl
runs=("OpenHands StuckDetector=out/openhands.jsonl" "Gemini CLI LoopDetectionService=out/gemini.jsonl")
if [ -d node_modules/@cline/core ]; then
  node cline.mjs "$CORPUS" out/cline.jsonl
  runs+=("Cline loop + mistake trackers=out/cline.jsonl")
fi
if [ -f out/crate.jsonl ]; then
  runs=("tower-toolcall, defaults=out/crate.jsonl" "${runs[@]}")
fi
python3 table.py --corpus "$CORPUS" "$@" "${runs[@]}"
