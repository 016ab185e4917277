// Shared by the GPU join kernels (grid_join_*.comp, brute_join_*.comp). The including file
// defines T (float or double).
//
// Match test: follows src/metric.rs exactly: arithmetic in T, dimensions in dataset order,
// `precise` (no FMA contraction), `acc <= thr` with thr from metric::threshold on the host;
// early exit every 4 dimensions (SHORTC: exact, partial sums never decrease).
//
// Continuations: a thread may stop before its query is finished, when its result slot is
// past the buffer's capacity or when it has used its loop budget (software rasterisers such
// as lavapipe silently cut loops after ~65535 iterations per workgroup, so there the host
// sets a budget per thread). It then saves where it stopped in `states`, raises
// counters[1], and the host dispatches the batch again: every pair is written exactly once.

#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_buffer_reference : require

// Workgroup size (spec constant 0) and linear_invocation() for 2-D dispatch grids.
#include "common.glsl"

layout(constant_id = 1) const uint DIM = 1;      // coordinates per point
layout(constant_id = 2) const uint K = 1;        // indexed dimensions (grid only)
layout(constant_id = 3) const uint METRIC = 0;   // 0 Euclidean, 1 Manhattan, 2 Chebyshev
layout(constant_id = 4) const uint SORT_DIM = 0; // SORTIDU dimension (grid only)

// Flags, binding numbers and the push-constant block: generated from src/gpu/interface.rs.
#include "join_interface.glsl"

const uint DONE = 0xFFFFFFFFu;

layout(std430, set = 0, binding = BINDING_R_COORDS) readonly buffer IndexedCoords { T r_coords[]; };
layout(std430, set = 0, binding = BINDING_Q_COORDS) readonly buffer QueryCoords { T q_coords[]; };
// The index arrays the LSS kernels write (glsl/lss.glsl defines JOIN_INDEX_ACCESS empty);
// read-only for the grid and brute-force kernels.
#ifndef JOIN_INDEX_ACCESS
#define JOIN_INDEX_ACCESS readonly
#endif
layout(std430, set = 0, binding = BINDING_CELL_KEYS) JOIN_INDEX_ACCESS buffer CellKeys { uint64_t cell_keys[]; };
layout(std430, set = 0, binding = BINDING_CELL_RANGES) JOIN_INDEX_ACCESS buffer CellRanges { uvec2 cell_ranges[]; };
layout(std430, set = 0, binding = BINDING_R_IDS) JOIN_INDEX_ACCESS buffer IndexedIds { uint r_ids[]; };
layout(std430, set = 0, binding = BINDING_Q_IDS) readonly buffer QueryIds { uint q_ids[]; };
layout(std430, set = 0, binding = BINDING_Q_CELLS) readonly buffer QueryCells { uint q_cells[]; };
// cells per dimension [K], mask offsets [K+1] (relative to 2K+1+DIM), dimensions by
// decreasing variance [DIM], mask coordinates.
layout(std430, set = 0, binding = BINDING_META) readonly buffer GridMeta { uint meta[]; };
layout(std430, set = 0, binding = BINDING_RESULTS) writeonly buffer Results { uvec2 results[]; };
// [0] result slots taken in this dispatch (may exceed capacity), [1] 1 if a query stopped.
layout(std430, set = 0, binding = BINDING_COUNTERS) buffer Counters { uint counters[]; };
// Per thread of the batch: (phase, combination, position + 1, matches so far); phase DONE
// when finished. Zeroed by the host before a batch's first dispatch.
layout(std430, set = 0, binding = BINDING_STATES) buffer States { uvec4 states[]; };
// LSS kNN (glsl/lss.glsl): per query position, the accumulator limit and the box radius.
layout(std430, set = 0, binding = BINDING_Q_LIMITS) buffer QueryLimits { T q_limits[]; };
layout(std430, set = 0, binding = BINDING_Q_RADII) readonly buffer QueryRadii { uint q_radii[]; };
// FLAG_DOT_FILTER: f32 copies of the indexed and query points centred on one centre, by
// point id: DIM coordinates then the squared norm n2 (cpu/dot_filter.rs `centred_rows`).
layout(std430, set = 0, binding = BINDING_R_DOT) readonly buffer IndexedDot { float r_dot[]; };
layout(std430, set = 0, binding = BINDING_Q_DOT) readonly buffer QueryDot { float q_dot[]; };

// FLAG_LINK (DBSCAN, src/dbscan.rs): by point id, 1 for a core point, and the union-find
// forest every thread links into (a parent is never above its point; roots are their own
// parents).
layout(std430, set = 0, binding = BINDING_LINK_CORE) readonly buffer LinkCore { uint link_core[]; };
layout(std430, set = 0, binding = BINDING_LINK_PARENT) coherent buffer LinkParent { uint link_parent[]; };

JOIN_PARAMS_BLOCK

T qp[DIM];          // the query point, in registers
uint q_id;
uint matches_seen;  // matches of this query so far (all dispatches)
uint used;          // loop iterations charged in this dispatch
bool stopped;       // out of budget or of result slots
uint stop_pos;      // where to resume the interrupted cell scan (position + 1)
float qf[DIM];      // FLAG_DOT_FILTER: the query's centred f32 copy and its n2
float qn2;
uint lane = 0u;     // this thread's share of its query's candidates (pc.lanes)
uint lanes = 1u;
uint64_t dot_tested = 0ul;   // candidates through the filter in this dispatch
uint64_t dot_rejected = 0ul; // ... and rejected by it

// The job's stop word (pc.stop_lo/hi): host-visible memory the host sets to 1 when the
// job is cancelled, so that a long dispatch ends early instead of running to its end. The
// threads read it every 2^18 charged iterations on a GPU (tens of microseconds of work:
// a stop waits that long, and the reads cost nothing measurable), every 2^8 on a
// software device (pc.budget != 0), whose budget allows a few thousand a dispatch. A
// stopped thread saves its state as for an exhausted budget; the host sees the job
// cancelled and discards the batch. `volatile` alone: glslang decorates it Coherent too, and
// `volatile coherent` decorated the member Coherent twice, which newer SPIR-V validators
// reject (the H200 run of 2026-11-28, validation layer 1.4.309).
layout(buffer_reference, std430, buffer_reference_align = 4) volatile readonly buffer StopWord { uint word; };

bool stop_asked() {
    uint64_t at = uint64_t(pc.stop_hi) << 32 | uint64_t(pc.stop_lo);
    return at != 0ul && StopWord(at).word != 0u;
}

// Charging `cost` from `used` crosses a stop-word reading point.
bool stop_check_due(uint cost) {
    uint shift = pc.budget != 0u ? 8u : 18u;
    return ((used + cost) >> shift) != (used >> shift);
}

// Charges `cost` loop iterations; false (and stops) when the budget would be exceeded or
// the job was stopped.
bool charge(uint cost) {
    if ((pc.budget != 0u && used + cost > pc.budget) || (stop_check_due(cost) && stop_asked())) {
        stopped = true;
        return false;
    }
    used += cost;
    return true;
}

// The accumulated distance (metric::distance_acc) between the query and indexed point
// `rpos`, over the dimensions in dataset order (the canonical order of src/metric.rs) or,
// when `reordered`, in REORDER's order (meta[2K+1 ..]). With `early`, it stops once the
// partial sum exceeds `limit` (checked every 4 dimensions) and returns that partial sum,
// which is > limit; without, it is the exact accumulator.
T partial_distance(uint rpos, bool reordered, T limit, bool early) {
    precise T acc = T(0);
    uint base = rpos * DIM;
    bool alive = true;
    for (uint t = 0u; t < DIM && alive; t++) {
        uint dim_t = reordered ? meta[2u * K + 1u + t] : t;
        precise T d = qp[dim_t] - r_coords[base + dim_t];
        if (METRIC == 0u) {
            acc = acc + d * d;
        } else if (METRIC == 1u) {
            acc = acc + abs(d);
        } else {
            acc = max(acc, abs(d));
        }
        alive = !early || (t & 3u) != 3u || acc <= limit;
    }
    return acc;
}

// The distance test against `limit` (see partial_distance).
bool distance_within(uint rpos, bool reordered, T limit) {
    return partial_distance(rpos, reordered, limit, true) <= limit;
}

// REORDER: the partial distance in variance order rejects most non-matches after a few
// dimensions. That order is not the canonical one, so it only rejects above a margin that
// covers any difference in rounding (metric::reject_margin, in thr_reject); survivors are
// decided in canonical order.
bool within_eps(uint rpos) {
    if ((pc.flags & FLAG_REORDER) != 0u && !distance_within(rpos, true, pc.thr_reject)) {
        return false;
    }
    return distance_within(rpos, false, pc.thr);
}

// The id of indexed position `rpos`.
uint indexed_id(uint rpos) {
#ifdef DIRECT_IDS
    return rpos; // brute force: positions are the ids
#else
    return r_ids[rpos];
#endif
}

// The dot-product filter (cpu/dot_filter.rs, the bound there): F = n_q + n_r - 2 q~.r~ in
// f32, with FMA or not, in any order (the bound holds for all); F > G proves a non-match.
// A NaN F is not > G: never a rejection. This is the verdict on a candidate with dot product
// `dot` (q~.r~) and squared norm `rn2`, counted; the untiled and the tiled scan both use it.
bool dot_verdict(float dot, float rn2) {
    float f = (qn2 + rn2) - 2.0 * dot;
    bool reject = f > float(pc.dot_cutoff);
    dot_tested += 1ul;
    dot_rejected += reject ? 1ul : 0ul;
    return reject;
}

// The filter on indexed position `rpos`, its copy read from the device buffer.
bool dot_rejects(uint rpos) {
    uint base = indexed_id(rpos) * (DIM + 1u);
    float dot = 0.0;
    for (uint t = 0u; t < DIM; t++) {
        dot = fma(qf[t], r_dot[base + t], dot);
    }
    return dot_verdict(dot, r_dot[base + DIM]);
}

// Adds `v` to the 64-bit counter at counters[at] (low word), counters[at + 1] (high word).
void add64(uint at, uint64_t v) {
    uint lo = uint(v);
    uint hi = uint(v >> 32);
    uint old = atomicAdd(counters[at], lo);
    if (old > 0xFFFFFFFFu - lo) hi += 1u; // the low word wrapped: carry
    if (hi != 0u) atomicAdd(counters[at + 1u], hi);
}

// FLAG_DOT_FILTER: this dispatch's filter counts into counters[2..6] (rejected, tested).
void flush_dot_counts() {
    if (dot_tested != 0ul) {
        add64(2u, dot_rejected);
        add64(4u, dot_tested);
    }
}

// FLAG_LINK: steps one union (its finds and retries together) may take; past them the
// pair is left to the host. Bounded because software devices cut long loops silently.
const uint LINK_STEPS = 64u;
const uint NO_ROOT = 0xFFFFFFFFu;

// The root of x, halving the path on the way (atomicMin: parents only ever go down, so a
// concurrent walk never undoes another's); NO_ROOT when `steps` ran out.
uint link_find(uint x, inout uint steps) {
    for (;;) {
        uint p = link_parent[x];
        if (p == x) return x;
        steps += 1u;
        if (steps > LINK_STEPS) return NO_ROOT;
        uint g = link_parent[p];
        atomicMin(link_parent[x], g);
        x = g;
    }
}

// Links the sets of a and b: the larger root goes under the smaller (the host's rule in
// dbscan.rs), by compare-and-swap so that concurrent links never lose one. False when it
// took more than LINK_STEPS (the host links the pair then).
bool link_unite(uint a, uint b) {
    uint steps = 0u;
    for (;;) {
        a = link_find(a, steps);
        b = link_find(b, steps);
        if (a == NO_ROOT || b == NO_ROOT) return false;
        if (a == b) return true;
        uint lo = min(a, b), hi = max(a, b);
        if (atomicCompSwap(link_parent[hi], hi, lo) == hi) return true;
        steps += 1u;
        if (steps > LINK_STEPS) return false;
        a = hi;
        b = lo;
    }
}

// FLAG_ABOVE / FLAG_NOT_SELF: indexed position `rpos` is not in the query's row (tested
// before the distance: it costs one id read).
bool row_skips(uint rpos) {
    if ((pc.flags & (FLAG_ABOVE | FLAG_NOT_SELF)) == 0u) return false;
    uint r_id = indexed_id(rpos);
    return ((pc.flags & FLAG_ABOVE) != 0u && r_id <= q_id)
        || ((pc.flags & FLAG_NOT_SELF) != 0u && r_id == q_id);
}

// Records a match with indexed position `rpos`. False when the result buffer is full (or,
// with FLAG_LINK, the loop budget): the thread stops and will re-test `rpos` when resumed.
bool emit(uint rpos) {
    if ((pc.flags & FLAG_COUNT) != 0u) {
        matches_seen += 1u;
        return true;
    }
    uint r_id = indexed_id(rpos);
    if ((pc.flags & FLAG_LINK) != 0u) {
        bool q_core = link_core[q_id] != 0u;
        bool r_core = link_core[r_id] != 0u;
        if (q_core == r_core) {
            // Two core points: linked here (charged as the longest link may run; a
            // repeated link after a resume changes nothing). Two non-core points: nothing
            // to do for DBSCAN.
            if (!q_core) {
                matches_seen += 1u;
                return true;
            }
            if (!charge(2u * LINK_STEPS + 2u)) return false;
            if (link_unite(q_id, r_id)) {
                matches_seen += 1u;
                return true;
            }
        }
    }
    uint slot = atomicAdd(counters[0], 1u);
    if (slot >= pc.capacity) {
        stopped = true;
        return false;
    }
    matches_seen += 1u;
    if ((pc.flags & FLAG_ROWS) != 0u) {
        // Key (query id) and value (indexed id) arrays, one u32 word each.
        results[slot >> 1][slot & 1u] = q_id;
        uint v = pc.capacity + slot;
        results[v >> 1][v & 1u] = r_id;
        return true;
    }
    uvec2 pair;
    if ((pc.flags & FLAG_SELF) != 0u) {
        pair = uvec2(min(q_id, r_id), max(q_id, r_id));
    } else if ((pc.flags & FLAG_SWAP) != 0u) {
        pair = uvec2(r_id, q_id);
    } else {
        pair = uvec2(q_id, r_id);
    }
    results[slot] = pair;
    return true;
}

// Compares the query with candidate positions [begin, end), this lane's only (positions
// congruent to `lane` modulo `lanes`); on a stop, stop_pos = the position to resume at + 1
// (a position of this lane, so a resumed scan starts on the lane).
void scan_positions(uint begin, uint end, bool windowed) {
    uint first = begin + (lane + lanes - begin % lanes) % lanes;
    for (uint p = first; p < end && !stopped; p += lanes) {
        if (windowed) {
            T diff = r_coords[p * DIM + SORT_DIM] - qp[SORT_DIM];
            if (diff > pc.window) break;
        }
        bool dot = (pc.flags & FLAG_DOT_FILTER) != 0u;
        uint passes = 1u + ((pc.flags & FLAG_REORDER) != 0u ? 1u : 0u) + (dot ? 1u : 0u);
        if (!charge(passes * DIM + 1u) || (!row_skips(p) && !(dot && dot_rejects(p)) && within_eps(p) && !emit(p))) {
            stop_pos = p + 1u;
        }
    }
}

// This thread's query (its index in the dispatch's queries) and lane, from pc.lanes.
uint split_lanes(uint thread) {
    lanes = max(pc.lanes, 1u);
    lane = thread % lanes;
    return thread / lanes;
}

void load_query(uint qpos) {
    for (uint t = 0u; t < DIM; t++) {
        qp[t] = q_coords[qpos * DIM + t];
    }
}

// FLAG_DOT_FILTER: the filter copy of query `id`.
void load_query_dot(uint id) {
    uint base = id * (DIM + 1u);
    for (uint t = 0u; t < DIM; t++) {
        qf[t] = q_dot[base + t];
    }
    qn2 = q_dot[base + DIM];
}
