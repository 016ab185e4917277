#!/usr/bin/env bash
# Compiles the kernels that Debian 12's glslang (12, behind the system's shaderc) cannot, to
# glsl/spirv/STEM.spv, with the newer glslang bundled in the shaderc-sys crate's sources
# (built here, once, into target/glslang), and records each source's hash in
# glsl/spirv/STEM.source: build.rs uses such a file only while the hash matches (see its
# `prebuilt`). Run after editing one of these kernels:
#   bash scripts/prebuilt-spirv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kernels=(grouped_tiles_coop)
src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/shaderc-sys-0.10.1/build/glslang 2>/dev/null | head -1)
[ -n "$src" ] || { echo "no shaderc-sys 0.10.1 sources: run cargo fetch first" >&2; exit 1; }
bin=target/glslang/StandAlone/glslang
if [ ! -x "$bin" ]; then
  cmake -S "$src" -B target/glslang -DCMAKE_BUILD_TYPE=Release -DENABLE_OPT=OFF -DGLSLANG_TESTS=OFF \
    -DBUILD_EXTERNAL=OFF -DENABLE_HLSL=OFF -DENABLE_SPVREMAPPER=OFF >/dev/null
  make -C target/glslang -j"$(nproc)" glslang-standalone >/dev/null 2>&1
fi
mkdir -p glsl/spirv
for k in "${kernels[@]}"; do
  # The includes spliced in (shaderc's include directive, which glslang alone lacks), and
  # the hash build.rs checks (its `source_hash`: FNV-1a of the source, then each include).
  tmp=$(mktemp -d)
  python3 - "glsl/$k.comp" "$tmp/$k.comp" >"glsl/spirv/$k.source" <<'PY'
import os, re, sys
src = open(sys.argv[1]).read()
spliced, hashed = [], src
for line in src.splitlines():
    m = re.fullmatch(r'#include "(.*)"', line.strip())
    inc = open(os.path.join(os.path.dirname(sys.argv[1]), m.group(1))).read() if m else None
    spliced.append(inc if m else line)
    hashed += inc or ""
open(sys.argv[2], "w").write("\n".join(spliced) + "\n")
h = 0xcbf29ce484222325
for b in hashed.encode():
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
print(f"{h:016x}")
PY
  # The same target as build.rs: Vulkan 1.2, SPIR-V 1.5.
  "$bin" -V --target-env vulkan1.2 --target-env spirv1.5 "$tmp/$k.comp" -o "glsl/spirv/$k.spv" >/dev/null ||
    { "$bin" -V --target-env vulkan1.2 --target-env spirv1.5 "$tmp/$k.comp" -o /dev/null; exit 1; }
  rm -rf "$tmp"
  echo "glsl/spirv/$k.spv: $(wc -c <"glsl/spirv/$k.spv") bytes, source $(cat "glsl/spirv/$k.source")"
done
