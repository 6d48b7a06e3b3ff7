#!/bin/sh
# Installs the peer of the gateway's benchmarks, mcp-proxy 0.6.0 (crates.io), into .tools/
# at the workspace's root (ignored by git), where the benches look for it, then runs them.
#
#   crates/toolcall-gateway/benches/mcp-proxy.sh            # install only
#   crates/toolcall-gateway/benches/mcp-proxy.sh --bench    # install, then safety, overhead, memory
#
# It builds from source, once (334 crates; 33 minutes on 2 cores shared with other builds).
set -eu
root="$(cd "$(dirname "$0")/../../.." && pwd)"
version=0.6.0
bin="$root/.tools/bin/mcp-proxy"
if [ -x "$bin" ] && grep -q "mcp-proxy $version" "$root/.tools/.crates.toml" 2>/dev/null; then
    echo "mcp-proxy $version already in $bin"
else
    cargo install mcp-proxy --version "$version" --locked --root "$root/.tools"
fi
if [ "${1:-}" = "--bench" ]; then
    cd "$root"
    cargo bench -p toolcall-gateway --bench safety
    cargo bench -p toolcall-gateway --bench overhead
    cargo bench -p toolcall-gateway --bench memory
fi
