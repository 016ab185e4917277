// Bitonic sort of (key, value) pairs, key type KEY_T (uint or uint64_t), values uint.
// Included by bitonic_u32.comp / bitonic_u64.comp, which define KEY_T and KEY_MAX.
//
// Any length n: the array is treated as padded to a power of two with elements greater
// than every real one. All compare-exchanges are ascending (the "flip" form of the
// network), so a pad never moves below index n: a pair whose upper index is >= n is
// skipped, and a shared-memory tile pads with (KEY_MAX, UINT_MAX), which ties only with an
// identical real element. Pairs are ordered by key, then value: the result is unique.
//
// MODE (spec constant 1):
//   0 LOCAL_SORT:  sort each tile of 2 * WORKGROUP_SIZE elements in shared memory.
//   1 LOCAL_MERGE: finish a merge in shared memory: strides TILE/2 .. 1 of each tile.
//   2 GLOBAL_STEP: one compare-exchange stage in global memory (stride >= TILE).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

layout(constant_id = 1) const uint MODE = 0;
const uint MODE_LOCAL_SORT = 0;
const uint MODE_LOCAL_MERGE = 1;
const uint MODE_GLOBAL_STEP = 2;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Keys { KEY_T key[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Values { uint value[]; };

layout(push_constant) uniform Params {
    Keys keys;
    Values values;
    uint n;
    // GLOBAL_STEP: half the distance of the compared pair (the stride, or for a flip
    // stage, half the merged block).
    uint half_span;
    // GLOBAL_STEP: 1 for the first stage of a merge (compare i with its mirror image).
    uint flip;
    uint unused;
};

// Tile = 2 * WORKGROUP_SIZE elements; each invocation does one compare-exchange per stage.
shared KEY_T tile_keys[2 * WORKGROUP_SIZE];
shared uint tile_values[2 * WORKGROUP_SIZE];

bool greater(KEY_T ka, uint va, KEY_T kb, uint vb) {
    return ka > kb || (ka == kb && va > vb);
}

// The pair (lo, hi) that invocation t compares in a stage with the given half span (a
// power of two: masks instead of integer division, which is slow on GPUs and CPUs alike).
uvec2 pair_of(uint t, uint half_span, bool flip) {
    uint r = t & (half_span - 1);
    uint block = (t - r) * 2;
    return flip ? uvec2(block + r, block + 2 * half_span - 1 - r) : uvec2(block + r, block + r + half_span);
}

void exchange_shared(uint t, uint half_span, bool flip) {
    uvec2 p = pair_of(t, half_span, flip);
    KEY_T ka = tile_keys[p.x];
    KEY_T kb = tile_keys[p.y];
    uint va = tile_values[p.x];
    uint vb = tile_values[p.y];
    if (greater(ka, va, kb, vb)) {
        tile_keys[p.x] = kb;
        tile_keys[p.y] = ka;
        tile_values[p.x] = vb;
        tile_values[p.y] = va;
    }
}

void main() {
    uint t = gl_LocalInvocationID.x;
    if (MODE == MODE_GLOBAL_STEP) {
        uint i = linear_invocation();
        uvec2 p = pair_of(i, half_span, flip != 0);
        if (p.y >= n) {
            return; // also covers p.x >= n, since p.x < p.y
        }
        KEY_T ka = keys.key[p.x];
        KEY_T kb = keys.key[p.y];
        uint va = values.value[p.x];
        uint vb = values.value[p.y];
        if (greater(ka, va, kb, vb)) {
            keys.key[p.x] = kb;
            keys.key[p.y] = ka;
            values.value[p.x] = vb;
            values.value[p.y] = va;
        }
        return;
    }

    uint tile_size = 2 * WORKGROUP_SIZE;
    uint base = linear_workgroup() * tile_size;
    if (base >= n) {
        return; // a surplus workgroup of a 2-D grid (uniform: the whole group leaves)
    }
    for (uint j = t; j < tile_size; j += WORKGROUP_SIZE) {
        uint g = base + j;
        bool real = g < n;
        tile_keys[j] = real ? keys.key[g] : KEY_MAX;
        tile_values[j] = real ? values.value[g] : 0xffffffffu;
    }
    barrier();
    if (MODE == MODE_LOCAL_SORT) {
        for (uint block = 2; block <= tile_size; block *= 2) {
            exchange_shared(t, block / 2, true);
            barrier();
            for (uint s = block / 4; s > 0; s /= 2) {
                exchange_shared(t, s, false);
                barrier();
            }
        }
    } else {
        for (uint s = tile_size / 2; s > 0; s /= 2) {
            exchange_shared(t, s, false);
            barrier();
        }
    }
    for (uint j = t; j < tile_size; j += WORKGROUP_SIZE) {
        uint g = base + j;
        if (g < n) {
            keys.key[g] = tile_keys[j];
            values.value[g] = tile_values[j];
        }
    }
}
