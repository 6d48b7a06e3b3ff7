#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine and is quiet when it is there:
# redis-server (the Redis tests start their own), openssl (the authentication tests make
# their keys with it), curl (the README's shell block runs with it), and the MCP interop kit
# (the official Python and TypeScript SDKs, at their pinned versions). protoc comes with the
# build (protoc-bin-vendored) unless PROTOC names another.
#
#   scripts/test-setup.sh && cargo test --workspace --all-features
#
# System packages are installed with apt-get, as root or through sudo; elsewhere it names
# what to install and stops.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in redis-server openssl curl; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    packages=()
    for tool in "${missing[@]}"; do
        case "$tool" in
            redis-server) packages+=(redis-server) ;;
            *) packages+=("$tool") ;;
        esac
    done
    as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            as_root=(sudo)
        else
            echo "scripts/test-setup.sh: install ${packages[*]} (as root: apt-get install -y ${packages[*]})" >&2
            exit 1
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test-setup.sh: install ${packages[*]} with your system's package manager" >&2
        exit 1
    fi
    "${as_root[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
fi

examples/tests/interop/setup.sh
