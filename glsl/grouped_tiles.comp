#version 460
// The grouped cosine join's blocks (src/gpu/grouped.rs, plan from src/cpu/partition/):
// one workgroup per tile of up to 32 x 32 vectors (positions into the f32 rows of A's and
// B's groups, listed in `list`), every f32 dot product of the tile, and each pair whose
// product reaches `floor` appended to `pairs` as (A position, B position) by
// grouped_emit.glsl (one slot reservation a workgroup; overflow runs the batch again in
// parts). A tile flagged TRIANGLE (a self-join's group with itself, the same list block on
// both sides) keeps only list positions x < y.
// The dot products are f32 sums in any order (fused or not): the bound that `floor` comes
// from (cpu/partition/products.rs `dot_slack`) holds for any order.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

// Rows per side of a tile, and coordinates staged in shared memory per step.
const uint SIDE = 32;
const uint CHUNK = 32;
const uint TRIANGLE = 1u << 16;

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer F32s { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer U32s { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Tiles { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Out { uint v[]; };

layout(push_constant) uniform Params {
    uint64_t rows_a;
    uint64_t rows_b;
    U32s list;
    Tiles tiles;
    Out pairs;
    // counter.v[0]: pairs found (may pass capacity).
    Out counter;
    uint first_tile;
    uint n_tiles;
    uint capacity;
    uint dim;
    float floor_dot;
    // Products at or above it: the rule accepts the pair for certain (flagged).
    float sure_dot;
};

// Coordinate-major: sa[c * SIDE + row].
shared float sa[CHUNK * SIDE];
shared float sb[CHUNK * SIDE];
shared uint ida[SIDE];
shared uint idb[SIDE];
// The tile's products: sc[x * SIDE + y].
shared float sc[SIDE * SIDE];
#include "grouped_emit.glsl"

void main() {
    uint t = linear_workgroup();
    // Surplus workgroups of a 2-D grid; uniform across the workgroup.
    if (t >= n_tiles) {
        return;
    }
    uvec4 tile = tiles.v[first_tile + t];
    uint na = tile.z & 0xFFu;
    uint nb = (tile.z >> 8) & 0xFFu;
    bool tri = (tile.z & TRIANGLE) != 0u;
    uint lid = gl_LocalInvocationID.x;
    // WORKGROUP_SIZE is 64: thread (ty, tx) owns rows ty + 8 r of A and tx + 8 c of B.
    uint tx = lid % 8u;
    uint ty = lid / 8u;
    if (lid < SIDE) {
        ida[lid] = lid < na ? list.v[tile.x + lid] : 0u;
        idb[lid] = lid < nb ? list.v[tile.y + lid] : 0u;
    }
    barrier();
    float acc[4][4];
    for (uint r = 0; r < 4; r++) {
        for (uint c = 0; c < 4; c++) {
            acc[r][c] = 0.0;
        }
    }
    for (uint c0 = 0; c0 < dim; c0 += CHUNK) {
        // Stage CHUNK coordinates of the tile's rows: 1024 floats a side, 16 per thread.
        for (uint e = lid; e < CHUNK * SIDE; e += WORKGROUP_SIZE) {
            uint row = e / CHUNK;
            uint c = e % CHUNK;
            float va = 0.0;
            float vb = 0.0;
            if (c0 + c < dim) {
                if (row < na) {
                    va = F32s(rows_a + (uint64_t(ida[row]) * dim + c0 + c) * 4ul).v[0];
                }
                if (row < nb) {
                    vb = F32s(rows_b + (uint64_t(idb[row]) * dim + c0 + c) * 4ul).v[0];
                }
            }
            sa[c * SIDE + row] = va;
            sb[c * SIDE + row] = vb;
        }
        barrier();
        uint steps = min(CHUNK, dim - c0);
        for (uint c = 0; c < steps; c++) {
            float a[4];
            float b[4];
            for (uint r = 0; r < 4; r++) {
                a[r] = sa[c * SIDE + ty + 8u * r];
                b[r] = sb[c * SIDE + tx + 8u * r];
            }
            for (uint r = 0; r < 4; r++) {
                for (uint q = 0; q < 4; q++) {
                    acc[r][q] = fma(a[r], b[q], acc[r][q]);
                }
            }
        }
        barrier();
    }
    for (uint r = 0; r < 4; r++) {
        for (uint q = 0; q < 4; q++) {
            sc[(ty + 8u * r) * SIDE + tx + 8u * q] = acc[r][q];
        }
    }
    barrier();
    emit_tile(na, nb, tri, floor_dot, sure_dot);
}
