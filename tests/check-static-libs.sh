#!/usr/bin/env bash
# Checks that the static link line documented in cmake/simjoinConfig.cmake and docs/c.md is
# what rustc says libsimjoin.a needs (`--print native-static-libs`), and that docs/c.md's
# static link line, run as written, builds its example (tests/c/example.c).
set -euo pipefail
cd "$(dirname "$0")/.."
printed=$(cargo rustc --release -p simjoin --lib --crate-type staticlib -- --print native-static-libs 2>&1 |
  sed -n 's/.*native-static-libs: //p' | tail -1)
if [ -z "$printed" ]; then
  echo "check-static-libs: rustc printed no native-static-libs line" >&2
  exit 1
fi
status=0
grep -qF "set(SIMJOIN_NATIVE_STATIC_LIBS $printed)" cmake/simjoinConfig.cmake || {
  echo "check-static-libs: cmake/simjoinConfig.cmake does not list: $printed" >&2
  status=1
}
grep -qF "libsimjoin.a $printed" docs/c.md || {
  echo "check-static-libs: docs/c.md's static link line does not end with: $printed" >&2
  status=1
}
[ $status = 0 ] || exit 1
# docs/c.md's line, run as written, must build a working program.
line=$(grep -E '^cc .*libsimjoin\.a' docs/c.md)
mkdir -p build
eval "$line"
[ "$(build/example)" = "$(printf '0 1\n2 3')" ] || { echo "check-static-libs: docs/c.md's static build misbehaves" >&2; exit 1; }
echo "check-static-libs: ok ($printed; docs/c.md's static link line builds and runs)"
