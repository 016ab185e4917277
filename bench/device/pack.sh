#!/usr/bin/env bash
# Here (x86-64, with the project's toolchain): stage in .device/ everything a run on the
# device machine (an H100/H200 through the `device` tool) needs, since that machine has no
# Rust and nothing there can be fetched: the GPU test binaries and the CLI, stripped; the
# Vulkan loader and validation layer packages; GDS-Join's sources (../shared/peers/gds-join)
# for nvcc to build there. Then, in each device call: carry [".device"] and run
#   bash bench/device/run.sh tests | bench low | bench high
# (bench/device/run.sh and BENCHMARKS.md "GPU mode" say what each does).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=.device
rm -rf "$out"; mkdir -p "$out/tests" "$out/debs"

# The test binaries that open a Vulkan device (tests/*.rs using the GPU backend or vk::).
tests=(vk_kernels kernel_interface gpu_lifetimes engine_lifecycle gpu_join gpu_join_2d_grid
  gpu_join_staging gpu_device_index gpu_dot_filter gpu_lss cpu_gpu_agreement dbscan auto_backend
  control cosine haversine gpu_stop gpu_rows gpu_lanes)
cargo test --release --no-run -p simjoin "${tests[@]/#/--test=}" --message-format=json 2>/dev/null |
  python3 -c '
import json, shutil, sys
wanted = set(sys.argv[2:])
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("name") in wanted and "test" in t.get("kind", []):
        shutil.copy(m["executable"], sys.argv[1] + "/" + t["name"])
        wanted.discard(t["name"])
if wanted:
    sys.exit(f"no test binary for: {sorted(wanted)}")
' "$out/tests" "${tests[@]}"
cargo build --release --bin simjoin --example gpu_join_bench
cp target/release/simjoin target/release/examples/gpu_join_bench "$out/"
strip "$out"/tests/* "$out/simjoin" "$out/gpu_join_bench"
# Compressed: 51 MiB of stripped binaries would leave too little of the 64 MiB carried.
tar -C "$out" -cf - tests simjoin gpu_join_bench | xz -T0 -6 >"$out/bins.tar.xz"
rm -rf "$out/tests" "$out/simjoin" "$out/gpu_join_bench"
# Tests that read the source tree (the GLSL files, the header) find it through the path
# cargo baked in: run.sh links that path to the tree on the device.
echo "$root" >"$out/MANIFEST_DIR"
git rev-parse --short HEAD >"$out/COMMIT"
git diff --quiet HEAD -- src glsl tests build.rs Cargo.toml || echo "(with uncommitted changes)" >>"$out/COMMIT"

# The loader (as the device tool's README says) and the validation layers, amd64 packages.
lists=$(mktemp -d); mkdir -p "$lists/partial"
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
apt-get "${o[@]}" update >/dev/null
(cd "$out/debs" && apt-get "${o[@]}" download libvulkan1 vulkan-validationlayers \
  libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2 libx11-6 libxext6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 >/dev/null)
rm -rf "$lists"
# Debian 13's validation layer too (1.4: it knows VK_KHR_cooperative_matrix, which the
# matrix-unit tiles use; 1.3.239 does not); run.sh takes it where its libraries load.
w=$(mktemp -d); mkdir -p "$w/lists/partial"
echo "deb http://deb.debian.org/debian trixie main" >"$w/sources.list"
o13=("${o[@]:0:2}" "-oDir::State::Lists=$w/lists" "-oDir::Etc::SourceList=$w/sources.list" -oDir::Etc::SourceParts=/dev/null)
if apt-get "${o13[@]}" update >/dev/null 2>&1; then
  (cd "$out/debs" && apt-get "${o13[@]}" download vulkan-validationlayers >/dev/null 2>&1) ||
    echo "pack: no Debian 13 validation layer: the device runs Debian 12's" >&2
fi
rm -rf "$w"

gds=${GDS_JOIN_SRC:-../shared/peers/gds-join}
if [ -d "$gds" ]; then
  cp -r "$gds" "$out/gds-join" && chmod -R u+w "$out/gds-join"
else
  echo "pack: no GDS-Join sources at $gds (GDS_JOIN_SRC): the benchmarks will run simjoin alone" >&2
fi
du -sh "$out"
size=$(du -sm "$out" | cut -f1)
[ "$size" -lt 40 ] || { echo "pack: $out is $size MiB; the device tool carries 64 MiB with the tree" >&2; exit 1; }
