// Bitonic sort of (key, value) pairs, key type KEY_T (uint or uint64_t), values uint: the
// elements of the network in bitonic.glsl. Included by bitonic_u32.comp / bitonic_u64.comp,
// which define KEY_T and KEY_MAX. Pairs are ordered by key, then value; a shared-memory
// tile pads with (KEY_MAX, UINT_MAX).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

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
    uint segments;
};

// Tile = 2 * WORKGROUP_SIZE elements; each invocation does one compare-exchange per stage.
shared KEY_T tile_keys[2 * WORKGROUP_SIZE];
shared uint tile_values[2 * WORKGROUP_SIZE];

bool greater(KEY_T ka, uint va, KEY_T kb, uint vb) {
    return ka > kb || (ka == kb && va > vb);
}

void global_exchange(uint seg, uint lo, uint hi) {
    uint a = seg * n + lo;
    uint b = seg * n + hi;
    KEY_T ka = keys.key[a];
    KEY_T kb = keys.key[b];
    uint va = values.value[a];
    uint vb = values.value[b];
    if (greater(ka, va, kb, vb)) {
        keys.key[a] = kb;
        keys.key[b] = ka;
        values.value[a] = vb;
        values.value[b] = va;
    }
}

void tile_load(uint j, uint seg, uint g) {
    bool real = g < n;
    tile_keys[j] = real ? keys.key[seg * n + g] : KEY_MAX;
    tile_values[j] = real ? values.value[seg * n + g] : 0xffffffffu;
}

void tile_store(uint j, uint seg, uint g) {
    keys.key[seg * n + g] = tile_keys[j];
    values.value[seg * n + g] = tile_values[j];
}

void tile_exchange(uint seg, uint a, uint b) {
    KEY_T ka = tile_keys[a];
    KEY_T kb = tile_keys[b];
    uint va = tile_values[a];
    uint vb = tile_values[b];
    if (greater(ka, va, kb, vb)) {
        tile_keys[a] = kb;
        tile_keys[b] = ka;
        tile_values[a] = vb;
        tile_values[b] = va;
    }
}

#include "bitonic.glsl"
