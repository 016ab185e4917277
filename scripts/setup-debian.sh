#!/usr/bin/env bash
# Installs the system packages simjoin needs on Debian/Ubuntu, only when some are missing:
# the Vulkan loader, lavapipe (software GPU) and validation layers; shaderc's static
# libraries (build.rs compiles the GLSL kernels); C/C++ toolchain and CMake for the C tests;
# Python with venv for the bindings' tests; PostgreSQL 15 (server, PGXS headers, PostGIS) and SQLite
# (shell and extension headers) for the database extensions' tests (tests/db/run.sh).
# Rust (cargo) must already be installed.
#   bash scripts/setup-debian.sh            everything the tests need
#   bash scripts/setup-debian.sh --build    only what building and the demo need (no
#                                           databases, CMake or Python)
set -euo pipefail
packages=(build-essential pkg-config libvulkan1 mesa-vulkan-drivers vulkan-validationlayers
  libshaderc-dev)
if [ "${1:-}" != "--build" ]; then
  packages+=(cmake python3 python3-pip python3-venv
    postgresql-15 postgresql-server-dev-15 postgresql-15-postgis-3 sqlite3 libsqlite3-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "setup: missing packages (${missing[*]}) and no apt-get: install them by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
