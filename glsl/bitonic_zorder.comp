#version 460
// Bitonic sort of point ids in Z-order (Morton order) of their quantised coordinates: the
// lists of LSS's set of Z-lists (src/gpu/lss.rs, src/gpu/zorder.rs). Segment s is list s:
// the ids 0..n-1, compared by their rows (DIM u32 coordinates each, < 2^31) shifted by
// s * shift in every dimension. Z-order without interleaved keys (any dimension count):
// the dimension holding the most significant differing bit decides, found with
// less_msb(x, y) = x < y && x < (x ^ y) (earlier dimensions first at equal bit levels);
// equal rows are ordered by id, so the order is unique. The network is bitonic.glsl's.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

layout(constant_id = 2) const uint DIM = 1;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Ids { uint id[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Rows { uint v[]; };

layout(push_constant) uniform Params {
    Ids ids;
    Rows rows;
    uint n;
    uint half_span;
    uint flip;
    uint segments;
    // List s is shifted by s * shift in every dimension.
    uint shift;
    uint unused;
};

// A pad: greater than every real element (ids are < 2^32 - 1).
const uint PAD = 0xffffffffu;
shared uint tile_ids[2 * WORKGROUP_SIZE];

// Whether point a comes after point b in list `seg`'s Z-order (ties: by id).
bool z_greater(uint a, uint b, uint seg) {
    if (a == PAD || b == PAD) {
        return a == PAD && b != PAD;
    }
    uint s = seg * shift;
    uint ra = a * DIM;
    uint rb = b * DIM;
    uint top = 0u;
    bool greater = false;
    for (uint t = 0u; t < DIM; t++) {
        uint x = rows.v[ra + t] + s;
        uint y = rows.v[rb + t] + s;
        uint diff = x ^ y;
        if (top < diff && top < (diff ^ top)) {
            top = diff;
            greater = x > y;
        }
    }
    return top == 0u ? a > b : greater;
}

void global_exchange(uint seg, uint lo, uint hi) {
    uint a = ids.id[seg * n + lo];
    uint b = ids.id[seg * n + hi];
    if (z_greater(a, b, seg)) {
        ids.id[seg * n + lo] = b;
        ids.id[seg * n + hi] = a;
    }
}

void tile_load(uint j, uint seg, uint g) {
    tile_ids[j] = g < n ? ids.id[seg * n + g] : PAD;
}

void tile_store(uint j, uint seg, uint g) {
    ids.id[seg * n + g] = tile_ids[j];
}

void tile_exchange(uint seg, uint a, uint b) {
    uint x = tile_ids[a];
    uint y = tile_ids[b];
    if (z_greater(x, y, seg)) {
        tile_ids[a] = y;
        tile_ids[b] = x;
    }
}

#include "bitonic.glsl"
