#!/usr/bin/env bash
# Installs the MCP interop kit: the official Python SDK (with mcp-server-time) into .venv and the
# official TypeScript SDK (with server-everything) into node_modules, both at the pinned versions
# of requirements.txt and package-lock.json.
#
#   examples/tests/interop/setup.sh
#
# Idempotent: when every pinned version is installed already it changes nothing and prints
# nothing. Needs python3 (>= 3.10, with its venv module), node (>= 20) and npm.
set -euo pipefail
cd "$(dirname "$0")"

fail() {
    echo "interop/setup.sh: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || fail "python3 not found; install it with: apt-get install -y python3 python3-venv"
command -v node >/dev/null 2>&1 || fail "node not found; install it with: apt-get install -y nodejs npm"
command -v npm >/dev/null 2>&1 || fail "npm not found; install it with: apt-get install -y npm"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || fail "python3 >= 3.10 is needed, found $(python3 --version 2>&1)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)' \
    || fail "node >= 20 is needed, found $(node --version)"

# Exits non-zero when a pin of requirements.txt is not the installed version.
python_pins_installed() {
    .venv/bin/python - requirements.txt <<'EOF' 2>/dev/null
import importlib.metadata as metadata
import sys

for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, version = line.partition("==")
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        sys.exit(1)
    if installed != version:
        sys.exit(1)
EOF
}

# Exits non-zero when a package of package-lock.json is not installed at its locked version.
node_packages_installed() {
    node --input-type=module - <<'EOF' 2>/dev/null
import { readFileSync } from 'node:fs';

const lock = JSON.parse(readFileSync('package-lock.json', 'utf8'));
for (const [path, entry] of Object.entries(lock.packages)) {
    if (path === '' || entry.link) continue;
    try {
        if (JSON.parse(readFileSync(`${path}/package.json`, 'utf8')).version !== entry.version) process.exit(1);
    } catch {
        if (!entry.optional) process.exit(1);
    }
}
EOF
}

# A venv whose interpreter is gone (python3 replaced or moved) is made anew.
if [ -d .venv ] && ! .venv/bin/python -c '' >/dev/null 2>&1; then
    rm -rf .venv
fi
if [ ! -d .venv ]; then
    python3 -m venv .venv \
        || { rm -rf .venv; fail "python3 -m venv failed; install the venv module with: apt-get install -y python3-venv"; }
fi
if ! python_pins_installed; then
    echo "interop/setup.sh: installing requirements.txt into .venv" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt \
        || fail "pip install -r requirements.txt failed"
    python_pins_installed || fail ".venv does not hold the versions of requirements.txt after pip install"
fi

if ! node_packages_installed; then
    echo "interop/setup.sh: installing package-lock.json into node_modules (npm ci)" >&2
    npm ci --no-audit --no-fund --loglevel=error >&2 || fail "npm ci failed"
    node_packages_installed || fail "node_modules does not hold the versions of package-lock.json after npm ci"
fi
