#version 460
// The GPU grid join's index built on the device (src/gpu/device_index.rs): the same arrays
// as the host build (src/gpu/index.rs), bit for bit. Buffers are passed by device address.
//
// MODE (spec constant 1), one thread per element i < n:
//   0 KEYS:  point i of `coords` (T = f32 or f64 by WORDS): its cell coordinates under the
//            geometry (`cells[i*k + a]`), its sort key `keys[i]` (PACK_CELL: the linear
//            cell id; PACK_CELL_SORT: id << 32 | the f32 SORTIDU coordinate's order bits),
//            `values[i] = i`, and where `aux` is set `aux[i]` = the SORTIDU coordinate's
//            order bits (u64).
//   1 RANKS: after sorting (SORTIDU bits, ids) into `values`: rank i is point p =
//            `values[i]`; `keys[i]` = its cell id (`aux[p]`), `out_b[i] = i`. Sorting
//            these by (cell id, rank) orders the points by (cell, SORTIDU, id).
//   2 HEADS: `heads[i]` = 1 where `keys[i] >> shift` differs from element i-1's (or i = 0).
//   3 CELLS: per head position i of the sorted points, cell c = `offsets[i]`: cell id,
//            range start (and the previous cell's end; position n-1 ends the last cell),
//            and one mask element (axis << 32 | coordinate) per indexed axis.
//   4 MASKS: per head i of the sorted mask elements: its coordinate at mask position
//            `offsets[i]`, the axis's first position, and (i = n-1) the total.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

layout(constant_id = 1) const uint MODE = 0;
// 32-bit words per coordinate: 1 (f32) or 2 (f64).
layout(constant_id = 2) const uint WORDS = 1;

const uint MODE_KEYS = 0;
const uint MODE_RANKS = 1;
const uint MODE_HEADS = 2;
const uint MODE_CELLS = 3;
const uint PACK_CELL = 0;
const uint NO_SORT_DIM = 0xffffffffu;

// One indexed axis: `GridGeometry`'s origin, width and cells, and the dataset dimension.
struct Axis {
    double origin;
    double width;
    uint cells;
    uint dim;
};

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Axes { Axis a[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint w[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer U64s { uint64_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Ranges { uvec2 r[]; };

layout(push_constant) uniform Params {
    uint64_t coords;   // KEYS: the points, row-major
    Axes axes;         // KEYS: k axes
    Words cells;       // KEYS: out; CELLS: the sorted points' cell coordinates (q_cells)
    U64s keys;         // KEYS: out; RANKS: out; HEADS, CELLS, MASKS: the sorted keys
    Words values;      // KEYS, RANKS: out; RANKS: the first sort's point ids
    uint64_t aux;      // KEYS: SORTIDU order bits out (or 0); RANKS: cell ids by point;
                       // CELLS, MASKS: the exclusive scan of the heads
    uint64_t out_a;    // HEADS: heads (u32); CELLS: cell ids (u64); MASKS: meta (u32)
    uint64_t out_b;    // CELLS: cell ranges (uvec2); RANKS: values2 (u32)
    uint64_t out_c;    // CELLS: mask elements (u64)
    uint n;
    uint dim;
    uint k;
    uint sort_dim;     // NO_SORT_DIM: none
    uint pack;
    uint shift;        // HEADS, CELLS: the cell id is key >> shift
    uint meta_base;    // MASKS: where the mask coordinates start in meta (2k + 1 + DIM)
    uint unused;
};

uint word(uint i, uint j, uint w) {
    return Words(coords + (uint64_t(i) * dim + j) * uint64_t(4u * WORDS)).w[w];
}

// Coordinate j of point i, exactly (f32 widens to f64 without rounding).
double coordinate(uint i, uint j) {
    if (WORDS == 2u) {
        return packDouble2x32(uvec2(word(i, j, 0u), word(i, j, 1u)));
    }
    return double(uintBitsToFloat(word(i, j, 0u)));
}

// Bits of coordinate j of point i whose unsigned order is f32/f64::total_cmp's.
uint64_t order_bits(uint i, uint j) {
    if (WORDS == 2u) {
        uint64_t b = packUint2x32(uvec2(word(i, j, 0u), word(i, j, 1u)));
        return (b >> 63) != 0ul ? ~b : b | (1ul << 63);
    }
    uint b = word(i, j, 0u);
    return uint64_t((b >> 31) != 0u ? ~b : b | 0x80000000u);
}

// src/grid.rs GridGeometry::coord, operation for operation: (x - origin) / width in f64,
// floored, clamped into [0, cells - 1].
uint cell_coord(Axis ax, double x) {
    precise double t = floor((x - ax.origin) / ax.width);
    if (t <= 0.0lf) {
        return 0u;
    }
    return uint(min(t, double(ax.cells - 1u)));
}

bool head(uint i) {
    return i == 0u || (keys.v[i] >> shift) != (keys.v[i - 1u] >> shift);
}

void main() {
    uint i = linear_invocation();
    if (i >= n) {
        return;
    }
    if (MODE == MODE_KEYS) {
        // GridGeometry::linear_id: row-major, the last indexed axis fastest.
        uint64_t id = 0ul;
        for (uint a = 0u; a < k; a++) {
            Axis ax = axes.a[a];
            uint c = cell_coord(ax, coordinate(i, ax.dim));
            cells.w[i * k + a] = c;
            id = id * uint64_t(ax.cells) + uint64_t(c);
        }
        uint64_t sort_bits = sort_dim == NO_SORT_DIM ? 0ul : order_bits(i, sort_dim);
        keys.v[i] = pack == PACK_CELL ? id : (id << 32) | sort_bits;
        values.w[i] = i;
        if (aux != 0ul) {
            U64s(aux).v[i] = sort_bits;
        }
    } else if (MODE == MODE_RANKS) {
        keys.v[i] = U64s(aux).v[values.w[i]];
        Words(out_b).w[i] = i;
    } else if (MODE == MODE_HEADS) {
        Words(out_a).w[i] = head(i) ? 1u : 0u;
    } else if (MODE == MODE_CELLS) {
        if (i == n - 1u) {
            Ranges(out_b).r[uint(U64s(aux).v[n]) - 1u].y = n;
        }
        if (!head(i)) {
            return;
        }
        uint c = uint(U64s(aux).v[i]);
        U64s(out_a).v[c] = keys.v[i] >> shift;
        Ranges(out_b).r[c].x = i;
        if (c > 0u) {
            Ranges(out_b).r[c - 1u].y = i;
        }
        for (uint a = 0u; a < k; a++) {
            U64s(out_c).v[c * k + a] = (uint64_t(a) << 32) | uint64_t(cells.w[i * k + a]);
        }
    } else {
        Words meta = Words(out_a);
        uint64_t total = U64s(aux).v[n];
        if (i == n - 1u) {
            meta.w[k + k] = uint(total);
        }
        if (!head(i)) {
            return;
        }
        uint pos = uint(U64s(aux).v[i]);
        meta.w[meta_base + pos] = uint(keys.v[i]);
        uint axis = uint(keys.v[i] >> 32);
        if (i == 0u || uint(keys.v[i - 1u] >> 32) != axis) {
            meta.w[k + axis] = pos;
        }
    }
}
