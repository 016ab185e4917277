#version 460
// The grouped cosine join's assignment on the device (src/gpu/grouped.rs): each of the 64
// rows a workgroup takes meets leaders first_leader .. first_leader + n_leaders in tiles
// of 64 (f32 dot products, coordinates staged in shared memory as in grouped_tiles.comp), and
// its largest product and that leader (the first of equal ones) are written to `out` as
// (leader, float bits), kept against the earlier leaders' best already there where
// first_leader > 0 (a dispatch takes many rows and a share of the leaders: enough
// workgroups to fill a GPU, a bounded time for a stop). Only the choice of leaders rests
// on it: the join's bounds are measured on whatever leader a row gets
// (cpu/partition/ `group`).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

// Rows (and leaders) a workgroup's tile holds: 64 x 64, each of its 64 threads an 8 x 8
// block of products (eight times as many multiply-adds as shared-memory reads, with the
// workgroup size of grouped_tiles.comp).
const uint SIDE = 64;
const uint PER = SIDE / 8u;
const uint CHUNK = 32;

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer F32s { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Out { uvec2 v[]; };

layout(push_constant) uniform Params {
    uint64_t rows;
    uint64_t leaders;
    Out out_best;
    // Rows first_row .. first_row + n_rows of `rows`, their answers at the same places.
    uint first_row;
    uint n_rows;
    uint first_leader;
    uint n_leaders;
    uint dim;
    uint pad;
};

shared float sa[CHUNK * SIDE];
shared float sb[CHUNK * SIDE];
shared float red_val[SIDE * 8];
shared uint red_idx[SIDE * 8];

void main() {
    uint base = linear_workgroup() * SIDE;
    // Surplus workgroups of a 2-D grid; uniform across the workgroup.
    if (base >= n_rows) {
        return;
    }
    uint na = min(SIDE, n_rows - base);
    uint lid = gl_LocalInvocationID.x;
    uint tx = lid % 8u;
    uint ty = lid / 8u;
    float best[PER];
    uint best_at[PER];
    for (uint r = 0; r < PER; r++) {
        best[r] = -3.0e38;
        best_at[r] = 0xFFFFFFFFu;
    }
    uint end = first_leader + n_leaders;
    for (uint l0 = first_leader; l0 < end; l0 += SIDE) {
        uint nb = min(SIDE, end - l0);
        float acc[PER][PER];
        for (uint r = 0; r < PER; r++) {
            for (uint q = 0; q < PER; q++) {
                acc[r][q] = 0.0;
            }
        }
        for (uint c0 = 0; c0 < dim; c0 += CHUNK) {
            for (uint e = lid; e < CHUNK * SIDE; e += WORKGROUP_SIZE) {
                uint row = e / CHUNK;
                uint c = e % CHUNK;
                float va = 0.0;
                float vb = 0.0;
                if (c0 + c < dim) {
                    if (row < na) {
                        va = F32s(rows + (uint64_t(first_row + base + row) * dim + c0 + c) * 4ul).v[0];
                    }
                    if (row < nb) {
                        vb = F32s(leaders + (uint64_t(l0 + row) * dim + c0 + c) * 4ul).v[0];
                    }
                }
                sa[c * SIDE + row] = va;
                sb[c * SIDE + row] = vb;
            }
            barrier();
            uint steps = min(CHUNK, dim - c0);
            for (uint c = 0; c < steps; c++) {
                float a[PER];
                float b[PER];
                for (uint r = 0; r < PER; r++) {
                    a[r] = sa[c * SIDE + ty + 8u * r];
                    b[r] = sb[c * SIDE + tx + 8u * r];
                }
                for (uint r = 0; r < PER; r++) {
                    for (uint q = 0; q < PER; q++) {
                        acc[r][q] = fma(a[r], b[q], acc[r][q]);
                    }
                }
            }
            barrier();
        }
        // Leaders in increasing index: a tie keeps the earlier one.
        for (uint q = 0; q < PER; q++) {
            uint y = tx + 8u * q;
            if (y < nb) {
                for (uint r = 0; r < PER; r++) {
                    if (acc[r][q] > best[r]) {
                        best[r] = acc[r][q];
                        best_at[r] = l0 + y;
                    }
                }
            }
        }
    }
    for (uint r = 0; r < PER; r++) {
        red_val[(ty + 8u * r) * 8u + tx] = best[r];
        red_idx[(ty + 8u * r) * 8u + tx] = best_at[r];
    }
    barrier();
    if (lid < na) {
        uint row = first_row + base + lid;
        // The earlier leaders' best first: on equal products it stays (smaller index).
        float v = red_val[lid * 8u];
        uint at = red_idx[lid * 8u];
        uint t0 = 1u;
        if (first_leader > 0u) {
            uvec2 prev = out_best.v[row];
            v = uintBitsToFloat(prev.y);
            at = prev.x;
            t0 = 0u;
        }
        for (uint t = t0; t < 8u; t++) {
            float w = red_val[lid * 8u + t];
            uint j = red_idx[lid * 8u + t];
            if (w > v || (w == v && j < at)) {
                v = w;
                at = j;
            }
        }
        out_best.v[row] = uvec2(at, floatBitsToUint(v));
    }
}
