// LSS (Lieberman, Sankaranarayanan & Samet 2008): the eps-join and the kNN join over a set
// of Z-order lists, one kernel per MODE (spec constant 5). Host side: src/gpu/lss.rs,
// src/gpu/knn.rs, src/gpu/zorder.rs. The including file defines T (float or double),
// T_BITS(x) (uvec2 bits of a T), T_FROM_BITS(v), and T_WORDS (1 or 2: result slots per kNN
// candidate).
//
// Buffers (the join interface's bindings, used this way here):
//   r_coords  indexed points, by id          q_coords  query points, by id
//   meta      indexed points' quantised rows (DIM u32 each, < 2^31), by id
//   q_cells   query points' quantised rows, by id
//   r_ids     the Z-lists: list l is r_ids[l*n .. (l+1)*n] (n = pc.n_cells), sorted in
//             Z-order of the rows shifted by l * pc.shift (glsl/bitonic_zorder.comp)
//   q_ids     query position -> query id (with FLAG_Q_IDS; else the position is the id)
// Indexed ids are internal: positions in list 0 (glsl/lss_permute.comp renumbers the set
// after the sort, so list 0 is the identity); the host maps them back. A self-join's or
// self-kNN's queries are the indexed points in list-0 order: query id = position.
//   cell_ranges  per query position: its interval [begin, end) in r_ids (global positions)
//   cell_keys    per query position (u64): its matches (COUNT), then, once scanned on the
//                host's stream, its first output rank; [count] = total
//   states    two uvec4 per query position: where a query stopped (continuations)
//   counters  [0] result slots taken (eps-join COUNT), [1] set when some query stopped
//             early (out of loop budget); [2], [3] sum of the chosen intervals' lengths
//   q_limits  kNN: per query position, the accumulator bound; q_radii: its box radius
//   results   pairs (eps-join), (id, accumulator) candidates (kNN), or kNN heaps
// A query position is pc.q_begin + thread for thread < pc.q_count.
//
// Every loop iteration is charged against pc.budget (software devices cut loops, see
// join_common.glsl); a query out of budget saves its state and raises counters[1], and the
// host dispatches again until no query stopped.

// This file writes cell_keys, cell_ranges and r_ids (read-only in the other kernels).
#define JOIN_INDEX_ACCESS
#include "join_common.glsl"

layout(constant_id = 5) const uint MODE = 0;
const uint MODE_INIT = 0;      // r_ids[i] = i % n: every list the identity
const uint MODE_SEARCH = 1;    // the shortest box interval over the lists -> cell_ranges
const uint MODE_COUNT = 2;     // matches in the interval -> cell_keys
const uint MODE_FILL = 3;      // matches with ranks in [rank, rank + capacity) -> results
const uint MODE_KNN_BOUND = 4; // an upper bound of the k-th accumulator -> q_limits
const uint MODE_KNN_BRUTE = 5; // the k best of all points by a heap per query -> results

const uint QMAX = 0x7FFFFFFFu;

uint qrow[DIM];   // the query's quantised row
uint corner[DIM]; // a box corner, shifted, for Z-order comparisons

uint query_id(uint pos) {
    return (pc.flags & FLAG_Q_IDS) != 0u ? q_ids[pos] : pos;
}

void load_qrow(uint id) {
    for (uint t = 0u; t < DIM; t++) {
        qrow[t] = q_cells[id * DIM + t];
    }
}

// corner = the low (or high) corner of the query's box of half-width r, clamped to
// [0, QMAX], shifted by s: all indexed rows inside the box lie between the two corners.
void set_corner(bool high, uint r, uint s) {
    for (uint t = 0u; t < DIM; t++) {
        uint c = high ? min(qrow[t], QMAX - r) + r : max(qrow[t], r) - r;
        corner[t] = c + s;
    }
}

// Sign of (indexed point id's row shifted by s) - corner in Z-order: the dimension of the
// most significant differing bit decides (less_msb as in glsl/bitonic_zorder.comp).
int z_compare(uint id, uint s) {
    uint base = id * DIM;
    uint top = 0u;
    bool greater = false;
    for (uint t = 0u; t < DIM; t++) {
        uint x = meta[base + t] + s;
        uint y = corner[t];
        uint diff = x ^ y;
        if (top < diff && top < (diff ^ top)) {
            top = diff;
            greater = x > y;
        }
    }
    return top == 0u ? 0 : (greater ? 1 : -1);
}

// Binary search in list `list` over positions [lo, hi): the first position whose row is
// >= corner (upper == false) or > corner (upper == true). False (lo, hi kept for resuming)
// when the budget ran out.
bool search_list(uint list, uint s, bool upper, inout uint lo, inout uint hi) {
    while (lo < hi) {
        if (!charge(DIM + 1u)) {
            return false;
        }
        uint mid = lo + ((hi - lo) >> 1);
        int c = z_compare(r_ids[list * pc.n_cells + mid], s);
        if (upper ? c <= 0 : c < 0) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return true;
}

void save(uint pos, uvec4 a, uvec4 b) {
    states[2u * pos] = a;
    states[2u * pos + 1u] = b;
}

void finish(uint pos) {
    save(pos, uvec4(DONE, 0u, 0u, 0u), uvec4(0u));
}

// SEARCH. State: (list + 1, phase, lo, hi) (list + 1 == 0: fresh; phase 0: the low
// corner's lower bound, 1: the high corner's upper bound), (lower bound, best list, best
// begin, best length + 1 (0: none yet)).
// Self-join: indexed ids are list-0 positions (lss_permute.comp), so in list 0 the
// partners with larger ids are the interval's part after the query's own position: that
// part is list 0's cost and interval.
void lss_search(uint pos) {
    uvec4 s0 = states[2u * pos];
    uvec4 s1 = states[2u * pos + 1u];
    if (s0.x == DONE) {
        return;
    }
    uint q_id = query_id(pos);
    bool self_pairs = (pc.flags & (FLAG_SELF | FLAG_KNN)) == FLAG_SELF;
    load_qrow(q_id);
    used = DIM;
    stopped = false;
    uint n = pc.n_cells;
    uint r = (pc.flags & FLAG_KNN) != 0u ? q_radii[pos] : pc.radius;
    uint list = s0.x == 0u ? 0u : s0.x - 1u;
    uint phase = s0.x == 0u ? 0u : s0.y;
    uint lo = s0.x == 0u ? 0u : s0.z;
    uint hi = s0.x == 0u ? n : s0.w;
    uint lb = s1.x;
    uint best_list = s1.y;
    uint best_begin = s1.z;
    uint best_len1 = s1.w;
    while (list < pc.lists) {
        uint s = list * pc.shift;
        if (!charge(DIM)) {
            break;
        }
        set_corner(phase == 1u, r, s);
        if (!search_list(list, s, phase == 1u, lo, hi)) {
            break;
        }
        if (phase == 0u) {
            // The upper bound is >= the lower bound: search from there.
            lb = lo;
            phase = 1u;
            hi = n;
        } else {
            uint from = self_pairs && list == 0u ? min(max(lb, q_id + 1u), lo) : lb;
            uint len = lo - from;
            if (best_len1 == 0u || len + 1u < best_len1) {
                best_len1 = len + 1u;
                best_list = list;
                best_begin = from;
            }
            list++;
            phase = 0u;
            lo = 0u;
            hi = n;
        }
    }
    if (stopped) {
        save(pos, uvec4(list + 1u, phase, lo, hi), uvec4(lb, best_list, best_begin, best_len1));
        counters[1] = 1u;
        return;
    }
    uint begin = best_list * n + best_begin;
    uint len = best_len1 - 1u;
    cell_ranges[pos] = uvec2(begin, begin + len);
    uint before = atomicAdd(counters[2], len);
    if (before + len < before) {
        atomicAdd(counters[3], 1u); // carry
    }
    finish(pos);
}

// One kNN candidate or heap entry (id, accumulator) at entry `slot`.
void write_candidate(uint slot, uint id, T acc) {
    if (T_WORDS == 1u) {
        results[slot] = uvec2(id, T_BITS(acc).x);
    } else {
        results[2u * slot] = uvec2(id, 0u);
        results[2u * slot + 1u] = T_BITS(acc);
    }
}

uint candidate_id(uint slot) {
    return results[T_WORDS * slot].x;
}

T candidate_acc(uint slot) {
    return T_WORDS == 1u ? T_FROM_BITS(uvec2(results[slot].y, 0u)) : T_FROM_BITS(results[2u * slot + 1u]);
}

// kNN COUNT tightens the bound: it also counts the candidates under TIGHTER thresholds
// (the bound times these factors, in distance units 1, 0.9, 0.8, 0.7, 0.55, 0.4) and keeps
// the smallest threshold that at least k candidates meet (k points within it bound the
// k-th accumulator just as well). Factors for accumulators: squared for Euclidean.
const uint TIGHTER = 5u;
// `precise`: the COUNT pass compares with these values and then stores the chosen one for
// FILL, so both must be the same bits.
T tighter(T bound, uint i) {
    const float f[5] = float[5](0.9, 0.8, 0.7, 0.55, 0.4);
    T x = T(f[i]);
    precise T t = METRIC == 0u ? bound * (x * x) : bound * x;
    return t;
}

// COUNT / FILL: walk the query's interval with the exact match test (join_common.glsl's
// distance, metric.rs's arithmetic). Self-join: only partners with a larger id (each
// unordered pair once, whatever list either point chose); self-kNN: all but the query.
// FILL writes the matches whose output rank (cell_keys[pos] + match number) lies in
// [rank, rank + capacity) at rank - rank_lo and pauses at the first one past the chunk.
// eps-join COUNT with capacity > 0 also writes each match at a slot taken from
// counters[0] while slots last: when the total fits, that is the whole output and the
// host skips the fill pass.
// State: (DONE or 0, next offset in the interval, matches so far, counts under the
// tighter thresholds (kNN COUNT) in the rest).
void lss_walk(uint pos, bool fill) {
    uvec4 s0 = states[2u * pos];
    if (s0.x == DONE) {
        return;
    }
    uvec4 s1 = states[2u * pos + 1u];
    uint tight[TIGHTER] = uint[TIGHTER](s0.w, s1.x, s1.y, s1.z, s1.w);
    uint q_id = query_id(pos);
    load_query(q_id);
    used = DIM;
    stopped = false;
    bool knn = (pc.flags & FLAG_KNN) != 0u;
    bool self_join = (pc.flags & FLAG_SELF) != 0u;
    bool swap = (pc.flags & FLAG_SWAP) != 0u;
    uvec2 iv = cell_ranges[pos];
    uint p = iv.x + s0.y;
    uint matches = s0.z;
    T limit = knn ? q_limits[pos] : pc.thr;
    uint64_t first = fill ? cell_keys[pos] : 0ul;
    if (fill && cell_keys[pos + 1u] == first) {
        finish(pos); // no matches (the count pass found none)
        return;
    }
    uint64_t chunk_lo = packUint2x32(uvec2(pc.rank_lo, pc.rank_hi));
    uint64_t chunk_hi = chunk_lo + uint64_t(pc.capacity);
    bool paused = false;
    for (; p < iv.y; p++) {
        uint id = r_ids[p];
        if (self_join && (knn ? id == q_id : id <= q_id)) {
            if (!charge(1u)) {
                break;
            }
            continue;
        }
        if (!charge(DIM + 1u)) {
            break;
        }
        T acc = partial_distance(id, false, limit, true);
        if (acc <= limit) {
            if (knn && !fill) {
                if (!charge(TIGHTER)) {
                    break;
                }
                for (uint i = 0u; i < TIGHTER; i++) {
                    tight[i] += acc <= tighter(limit, i) ? 1u : 0u;
                }
            }
            if (!fill && !knn && pc.capacity != 0u) {
                uint slot = atomicAdd(counters[0], 1u);
                if (slot < pc.capacity) {
                    results[slot] = swap ? uvec2(id, q_id) : uvec2(q_id, id);
                }
            }
            if (fill) {
                uint64_t rank = first + uint64_t(matches);
                if (rank >= chunk_hi) {
                    paused = true;
                    break;
                }
                if (rank >= chunk_lo) {
                    uint slot = uint(rank - chunk_lo);
                    if (knn) {
                        write_candidate(slot, id, acc);
                    } else {
                        results[slot] = swap ? uvec2(id, q_id) : uvec2(q_id, id);
                    }
                }
            }
            matches++;
        }
    }
    if (stopped || paused) {
        save(pos, uvec4(0u, p - iv.x, matches, tight[0]),
             uvec4(tight[1], tight[2], tight[3], tight[4]));
        if (stopped) {
            counters[1] = 1u;
        }
        return;
    }
    if (!fill) {
        if (knn) {
            // The tightest threshold with >= k candidates (the bound itself has >= k).
            T best = limit;
            for (uint i = 0u; i < TIGHTER; i++) {
                if (tight[i] >= pc.k) {
                    best = tighter(limit, i);
                    matches = tight[i];
                }
            }
            q_limits[pos] = best;
        }
        cell_keys[pos] = uint64_t(matches);
    }
    finish(pos);
}

// KNN_BOUND: an upper bound of the query's k-th smallest accumulator. In each list, the
// window of W = k (+1 for a self-kNN: the query may be in it) consecutive positions around
// the query's own Z-order position holds >= k distinct points other than the query, so
// the largest accumulator among them bounds the k-th smallest; the bound is the smallest
// over the lists (a list stops as soon as one candidate exceeds the bound so far).
// State: (list + 1, phase (0: search, 1: window), lo or window start, hi or window offset),
// (have a bound, the window's maximum (bits)); the bound so far in q_limits[pos].
void knn_bound(uint pos) {
    uvec4 s0 = states[2u * pos];
    uvec4 s1 = states[2u * pos + 1u];
    if (s0.x == DONE) {
        return;
    }
    uint q_id = query_id(pos);
    load_query(q_id);
    load_qrow(q_id);
    used = 2u * DIM;
    stopped = false;
    uint n = pc.n_cells;
    bool self_join = (pc.flags & FLAG_SELF) != 0u;
    uint window = pc.k + (self_join ? 1u : 0u);
    uint list = s0.x == 0u ? 0u : s0.x - 1u;
    uint phase = s0.x == 0u ? 0u : s0.y;
    uint lo = s0.x == 0u ? 0u : s0.z;
    uint hi = s0.x == 0u ? n : s0.w;
    bool have = s1.x != 0u;
    T best = have ? q_limits[pos] : T(0);
    T lmax = T_FROM_BITS(s1.yz);
    while (list < pc.lists) {
        uint s = list * pc.shift;
        if (phase == 0u) {
            if (!charge(DIM)) {
                break;
            }
            set_corner(false, 0u, s);
            if (!search_list(list, s, false, lo, hi)) {
                break;
            }
            uint half_w = window / 2u;
            lo = min(lo > half_w ? lo - half_w : 0u, n - window);
            hi = 0u;
            phase = 1u;
            lmax = T(0);
        }
        bool beaten = false;
        for (; hi < window; hi++) {
            uint id = r_ids[list * n + lo + hi];
            if (self_join && id == q_id) {
                if (!charge(1u)) {
                    break;
                }
                continue;
            }
            if (!charge(DIM + 1u)) {
                break;
            }
            T acc = partial_distance(id, false, best, have);
            if (have && acc > best) {
                beaten = true;
                break;
            }
            lmax = max(lmax, acc);
        }
        if (stopped) {
            break;
        }
        if (!beaten) {
            best = have ? min(best, lmax) : lmax;
            have = true;
        }
        list++;
        phase = 0u;
        lo = 0u;
        hi = n;
    }
    q_limits[pos] = best;
    if (stopped) {
        save(pos, uvec4(list + 1u, phase, lo, hi), uvec4(have ? 1u : 0u, T_BITS(lmax), 0u));
        counters[1] = 1u;
        return;
    }
    finish(pos);
}

// Heap order of kNN entries: by (accumulator, id).
bool entry_greater(T a, uint ia, T b, uint ib) {
    return a > b || (a == b && ia > ib);
}

// KNN_BRUTE: every data point against the query; the k best by (accumulator, id) kept in
// a max-heap at entries [thread * k, (thread + 1) * k) of results (the host sorts them).
// Points come in id order, so a later point with an equal accumulator never displaces an
// entry. State: (0, next point, heap size, 0).
void knn_brute(uint pos) {
    uvec4 s0 = states[2u * pos];
    if (s0.x == DONE) {
        return;
    }
    uint q_id = query_id(pos);
    load_query(q_id);
    used = DIM;
    stopped = false;
    bool self_join = (pc.flags & FLAG_SELF) != 0u;
    uint k = pc.k;
    uint base = (pos - pc.q_begin) * k;
    uint j = s0.y;
    uint size = s0.z;
    for (; j < pc.n_cells; j++) {
        if (self_join && j == q_id) {
            if (!charge(1u)) {
                break;
            }
            continue;
        }
        // The distance, then a sift of at most log2(k) + 1 levels.
        if (!charge(DIM + 2u + pc.log_cells)) {
            break;
        }
        if (size < k) {
            T acc = partial_distance(j, false, T(0), false);
            // Sift up.
            uint i = size;
            while (i > 0u) {
                uint parent = (i - 1u) >> 1;
                T pa = candidate_acc(base + parent);
                uint pi = candidate_id(base + parent);
                if (!entry_greater(acc, j, pa, pi)) {
                    break;
                }
                write_candidate(base + i, pi, pa);
                i = parent;
            }
            write_candidate(base + i, j, acc);
            size++;
        } else {
            T top = candidate_acc(base);
            T acc = partial_distance(j, false, top, true);
            if (!(acc < top)) {
                continue;
            }
            // Replace the top and sift down.
            uint i = 0u;
            while (true) {
                uint c = 2u * i + 1u;
                if (c >= k) {
                    break;
                }
                T ca = candidate_acc(base + c);
                uint ci = candidate_id(base + c);
                if (c + 1u < k) {
                    T da = candidate_acc(base + c + 1u);
                    uint di = candidate_id(base + c + 1u);
                    if (entry_greater(da, di, ca, ci)) {
                        c = c + 1u;
                        ca = da;
                        ci = di;
                    }
                }
                if (!entry_greater(ca, ci, acc, j)) {
                    break;
                }
                write_candidate(base + i, ci, ca);
                i = c;
            }
            write_candidate(base + i, j, acc);
        }
    }
    if (stopped) {
        save(pos, uvec4(0u, j, size, 0u), uvec4(0u));
        counters[1] = 1u;
        return;
    }
    finish(pos);
}

void main() {
    uint thread = linear_invocation();
    if (MODE == MODE_INIT) {
        if (thread < pc.lists * pc.n_cells) {
            r_ids[thread] = thread % pc.n_cells;
        }
        return;
    }
    if (thread >= pc.q_count) {
        return;
    }
    uint pos = pc.q_begin + thread;
    if (MODE == MODE_SEARCH) {
        lss_search(pos);
    } else if (MODE == MODE_COUNT) {
        lss_walk(pos, false);
    } else if (MODE == MODE_FILL) {
        lss_walk(pos, true);
    } else if (MODE == MODE_KNN_BOUND) {
        knn_bound(pos);
    } else {
        knn_brute(pos);
    }
}
