// The bitonic sorting network shared by the sort kernels: bitonic_u32.comp / bitonic_u64.comp
// ((key, value) pairs) and bitonic_zorder.comp (point ids in Z-order of their quantised
// coordinates, LSS). This file owns the network (which elements a stage compares, tiles,
// padding, segments); the including file owns the elements: where they live and how two
// compare. It declares, before including this file:
//   - a push-constant block with at least `uint n` (elements per segment), `uint half_span`,
//     `uint flip` (see GLOBAL_STEP) and `uint segments` (independent arrays of n elements,
//     sorted by the same dispatches: segment s holds elements s*n .. s*n + n-1);
//   - void global_exchange(uint seg, uint lo, uint hi): compare-exchange elements lo < hi
//     of segment `seg` in global memory (the smaller one to lo);
//   - void tile_load(uint j, uint seg, uint g): element g of segment seg into shared slot j,
//     or a pad (greater than every real element) when g >= n;
//   - void tile_store(uint j, uint seg, uint g): shared slot j back to element g (< n);
//   - void tile_exchange(uint seg, uint a, uint b): compare-exchange shared slots a < b.
//
// Any length n: each segment is treated as padded to a power of two with elements greater
// than every real one. All compare-exchanges are ascending (the "flip" form of the
// network), so a pad never moves below index n: a pair whose upper index is >= n is
// skipped, and a shared-memory tile pads with elements that tie only with an identical
// real element. The including file orders equal keys by a unique tie-break (the value or
// the id), so the result is unique.
//
// MODE (spec constant 1):
//   0 LOCAL_SORT:  sort each tile of 2 * WORKGROUP_SIZE elements in shared memory.
//   1 LOCAL_MERGE: finish a merge in shared memory: strides TILE/2 .. 1 of each tile.
//   2 GLOBAL_STEP: one compare-exchange stage in global memory (stride >= TILE).
// Threads: GLOBAL_STEP segments * padded/2 (padded = n rounded up to a power of two);
// the local modes segments * ceil(n / TILE) workgroups.
#include "common.glsl"

layout(constant_id = 1) const uint MODE = 0;
const uint MODE_LOCAL_SORT = 0;
const uint MODE_LOCAL_MERGE = 1;
const uint MODE_GLOBAL_STEP = 2;

// The pair (lo, hi) that invocation t compares in a stage with the given half span (a
// power of two: masks instead of integer division, which is slow on GPUs and CPUs alike).
uvec2 pair_of(uint t, uint half_span, bool flip) {
    uint r = t & (half_span - 1);
    uint block = (t - r) * 2;
    return flip ? uvec2(block + r, block + 2 * half_span - 1 - r) : uvec2(block + r, block + r + half_span);
}

void exchange_shared(uint seg, uint t, uint half_span, bool flip) {
    uvec2 p = pair_of(t, half_span, flip);
    tile_exchange(seg, p.x, p.y);
}

void main() {
    uint t = gl_LocalInvocationID.x;
    if (MODE == MODE_GLOBAL_STEP) {
        uint i = linear_invocation();
        // Half the padded length: each segment has that many compare-exchanges per stage.
        uint half_padded = n <= 1u ? 1u : (1u << findMSB(n - 1u));
        uint seg = i >> findMSB(half_padded);
        if (seg >= segments) {
            return;
        }
        uvec2 p = pair_of(i & (half_padded - 1u), half_span, flip != 0);
        if (p.y >= n) {
            return; // also covers p.x >= n, since p.x < p.y
        }
        global_exchange(seg, p.x, p.y);
        return;
    }

    uint tile_size = 2 * WORKGROUP_SIZE;
    uint tiles = (n + tile_size - 1u) / tile_size;
    uint group = linear_workgroup();
    uint seg = group / tiles;
    if (seg >= segments) {
        return; // a surplus workgroup of a 2-D grid (uniform: the whole group leaves)
    }
    uint base = (group - seg * tiles) * tile_size;
    for (uint j = t; j < tile_size; j += WORKGROUP_SIZE) {
        tile_load(j, seg, base + j);
    }
    barrier();
    if (MODE == MODE_LOCAL_SORT) {
        for (uint block = 2; block <= tile_size; block *= 2) {
            exchange_shared(seg, t, block / 2, true);
            barrier();
            for (uint s = block / 4; s > 0; s /= 2) {
                exchange_shared(seg, t, s, false);
                barrier();
            }
        }
    } else {
        for (uint s = tile_size / 2; s > 0; s /= 2) {
            exchange_shared(seg, t, s, false);
            barrier();
        }
    }
    for (uint j = t; j < tile_size; j += WORKGROUP_SIZE) {
        uint g = base + j;
        if (g < n) {
            tile_store(j, seg, g);
        }
    }
}
