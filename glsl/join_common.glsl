// Shared by the GPU join kernels (grid_join_*.comp, brute_join_*.comp). The including file
// defines T (float or double). The match test follows src/metric.rs exactly: arithmetic in
// T, dimensions in dataset order, `precise` (no FMA contraction), `acc <= thr` with thr
// computed on the host by metric::threshold; early exit every 4 dimensions (SHORTC, exact
// because partial sums never decrease).

#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

// Spec constant 0 is the workgroup size (the vk layer's convention).
layout(local_size_x_id = 0) in;

layout(constant_id = 1) const uint DIM = 1;      // coordinates per point
layout(constant_id = 2) const uint K = 1;        // indexed dimensions (grid only)
layout(constant_id = 3) const uint METRIC = 0;   // 0 Euclidean, 1 Manhattan, 2 Chebyshev
layout(constant_id = 4) const uint SORT_DIM = 0; // SORTIDU dimension (grid only)

// Linear thread index: large dispatches are spread over a 2-D grid of workgroups.
uint thread_index() {
    return gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * gl_WorkGroupSize.x) + gl_GlobalInvocationID.x;
}

// Flags (push constant `flags`).
const uint FLAG_SELF = 1u;    // self-join: unicomp + home cell from the next position on
const uint FLAG_COUNT = 2u;   // count only: per-query counts, no pairs written
const uint FLAG_SWAP = 4u;    // write pairs as (indexed id, query id)
const uint FLAG_SORTIDU = 8u; // cells are sorted on SORT_DIM: search a window

layout(std430, set = 0, binding = 0) readonly buffer IndexedCoords { T r_coords[]; };
layout(std430, set = 0, binding = 1) readonly buffer QueryCoords { T q_coords[]; };
layout(std430, set = 0, binding = 2) readonly buffer CellKeys { uint64_t cell_keys[]; };
layout(std430, set = 0, binding = 3) readonly buffer CellRanges { uvec2 cell_ranges[]; };
layout(std430, set = 0, binding = 4) readonly buffer IndexedIds { uint r_ids[]; };
layout(std430, set = 0, binding = 5) readonly buffer QueryIds { uint q_ids[]; };
layout(std430, set = 0, binding = 6) readonly buffer QueryCells { uint q_cells[]; };
// cells per dimension [K], mask offsets [K+1] (relative to 2K+1), mask coordinates.
layout(std430, set = 0, binding = 7) readonly buffer GridMeta { uint meta[]; };
layout(std430, set = 0, binding = 8) writeonly buffer Results { uvec2 results[]; };
// [0] pairs emitted by this batch (may exceed capacity: overflow), [1] u32 wrap flag,
// count mode: [2 + i] = matches of query i of the batch.
layout(std430, set = 0, binding = 9) buffer Counters { uint counters[]; };

layout(push_constant) uniform Params {
    uint q_begin;   // first query position of the batch
    uint q_count;   // queries in the batch
    uint q_stride;  // query position = q_begin + thread * q_stride (estimation samples)
    uint capacity;  // result slots in `results`
    uint skip;      // matches of each query to skip (re-run of one overflowing query)
    uint flags;
    uint n_cells;   // non-empty cells (grid) or indexed points (brute)
    uint pad0;
    T thr;          // metric::threshold(metric, eps)
    T window;       // SORTIDU half-window: > any |q_u - r_u| of a matching pair
} pc;

T qp[DIM];          // the query point, in registers
uint q_id;
uint matches_seen;  // matches found by this thread so far (deterministic order)

bool within_eps(uint rpos) {
    precise T acc = T(0);
    uint base = rpos * DIM;
    for (uint t = 0u; t < DIM; t++) {
        precise T d = qp[t] - r_coords[base + t];
        if (METRIC == 0u) {
            acc = acc + d * d;
        } else if (METRIC == 1u) {
            acc = acc + abs(d);
        } else {
            acc = max(acc, abs(d));
        }
        if ((t & 3u) == 3u && acc > pc.thr) {
            return false;
        }
    }
    return acc <= pc.thr;
}

void emit(uint r_id) {
    uint seen = matches_seen;
    matches_seen = seen + 1u;
    if (seen < pc.skip || (pc.flags & FLAG_COUNT) != 0u) {
        return;
    }
    uint slot = atomicAdd(counters[0], 1u);
    if (slot == 0xFFFFFFFFu) {
        counters[1] = 1u; // the counter wrapped: the host re-runs the batch split
    }
    if (slot < pc.capacity) {
        uvec2 pair;
        if ((pc.flags & FLAG_SELF) != 0u) {
            pair = uvec2(min(q_id, r_id), max(q_id, r_id));
        } else if ((pc.flags & FLAG_SWAP) != 0u) {
            pair = uvec2(r_id, q_id);
        } else {
            pair = uvec2(q_id, r_id);
        }
        results[slot] = pair;
    }
}

// Loads query position `qpos` into registers.
void load_query(uint qpos) {
    for (uint t = 0u; t < DIM; t++) {
        qp[t] = q_coords[qpos * DIM + t];
    }
}

void finish_query(uint thread) {
    if ((pc.flags & FLAG_COUNT) != 0u) {
        counters[2u + thread] = matches_seen;
    }
}
