#version 460
// The grouped cosine join's tiles on a GPU's matrix units (VK_KHR_cooperative_matrix): the
// tiles, member lists and output of grouped_tiles.comp, the dot products computed from f16
// copies of the f32 rows, scaled by 2^8, in 16 x 16 x 16 products with f32 accumulation.
// The workgroup is four subgroups (WORKGROUP_SIZE = 4 x the subgroup size), one per
// 16 x 16 quadrant of a 32 x 32 tile.
//
// The floor the host passes (cpu/partition.rs `dot_slack_f16`) covers what f16 adds: each
// coordinate's conversion (any rounding: one f16 ulp; below f16's normal range, where a
// device may flush, the scale 2^8 leaves an error of at most 2^-22), and an accumulation
// that may truncate. Products and sums are compared scaled by 2^16 (exact: a power of two).
// The host confirms every pair by the cosine rule. (Cooperative matrices bring the Vulkan
// memory model: the device enables `vulkanMemoryModel` with them.)
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"

const uint SIDE = 32;
const uint CHUNK = 32;
const uint TRIANGLE = 1u << 16;
// Coordinates are scaled by 2^8 before the f16 conversion, products by 2^16.
const float SCALE = 256.0;
const float SCALE2 = 65536.0;

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer F32s { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer U32s { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Tiles { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Out { uint v[]; };

// As in grouped_tiles.comp (src/gpu/grouped.rs `Params`).
layout(push_constant) uniform Params {
    uint64_t rows_a;
    uint64_t rows_b;
    U32s list;
    Tiles tiles;
    Out pairs;
    Out counter;
    uint first_tile;
    uint n_tiles;
    uint capacity;
    uint dim;
    float floor_dot;
    // Products at or above it: the rule accepts the pair for certain (flagged).
    float sure_dot;
};

// Row-major: sa[row * CHUNK + c], f16 copies of CHUNK coordinates of the tile's rows.
shared float16_t sa[SIDE * CHUNK];
shared float16_t sb[SIDE * CHUNK];
// The tile's products (scaled): sc[x * SIDE + y].
shared float sc[SIDE * SIDE];
shared uint ida[SIDE];
shared uint idb[SIDE];
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
    if (lid < SIDE) {
        ida[lid] = lid < na ? list.v[tile.x + lid] : 0u;
        idb[lid] = lid < nb ? list.v[tile.y + lid] : 0u;
    }
    barrier();
    // This subgroup's quadrant: rows 16 qa.. of A, 16 qb.. of B.
    uint qa = gl_SubgroupID >> 1;
    uint qb = gl_SubgroupID & 1u;
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    for (uint c0 = 0; c0 < dim; c0 += CHUNK) {
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
            sa[row * CHUNK + c] = float16_t(va * SCALE);
            sb[row * CHUNK + c] = float16_t(vb * SCALE);
        }
        barrier();
        for (uint k = 0; k < CHUNK; k += 16) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> ma;
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> mb;
            coopMatLoad(ma, sa, qa * 16u * CHUNK + k, CHUNK, gl_CooperativeMatrixLayoutRowMajor);
            // B (k x n) is B's rows as columns.
            coopMatLoad(mb, sb, qb * 16u * CHUNK + k, CHUNK, gl_CooperativeMatrixLayoutColumnMajor);
            acc = coopMatMulAdd(ma, mb, acc);
        }
        barrier();
    }
    coopMatStore(acc, sc, qa * 16u * SIDE + qb * 16u, SIDE, gl_CooperativeMatrixLayoutRowMajor);
    barrier();
    emit_tile(na, nb, tri, floor_dot * SCALE2, sure_dot * SCALE2);
}
