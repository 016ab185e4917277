#!/usr/bin/env bash
# Checks that the static link line documented in cmake/simjoinConfig.cmake and README.md is
# what rustc says libsimjoin.a needs (`--print native-static-libs`).
set -euo pipefail
cd "$(dirname "$0")/.."
printed=$(cargo rustc --release --lib --crate-type staticlib -- --print native-static-libs 2>&1 |
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
grep -qF "libsimjoin.a $printed" README.md || {
  echo "check-static-libs: README.md's static link line does not end with: $printed" >&2
  status=1
}
[ $status = 0 ] && echo "check-static-libs: ok ($printed)"
exit $status
