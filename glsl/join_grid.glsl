// The eps-grid search kernel (GPU-SJ Algorithm 1 with unicomp; GPU-JOIN's k < n indexed
// dimensions, SORTIDU and SHORTC). One thread per query point. Phases of a query:
// 0 = home cell (self-join) or every adjacent cell (A ⋈ B); 1 + j = the unicomp cells of
// dimension j. Binary searches are lower bounds without early exits.
#include "join_common.glsl"

uint cells_per_dim(uint a) { return meta[a]; }

bool mask_has(uint a, uint c) {
    uint lo = meta[K + a], hi = meta[K + a + 1u];
    uint end = hi;
    uint base = 2u * K + 1u + DIM;
    while (lo < hi) {
        uint mid = (lo + hi) >> 1;
        if (meta[base + mid] < c) lo = mid + 1u; else hi = mid;
    }
    return lo < end && meta[base + lo] == c;
}

// Index of the non-empty cell with this linear id, or -1 (binary search of B).
int find_cell(uint64_t key) {
    uint lo = 0u, hi = pc.n_cells;
    while (lo < hi) {
        uint mid = (lo + hi) >> 1;
        if (cell_keys[mid] < key) lo = mid + 1u; else hi = mid;
    }
    return lo < pc.n_cells && cell_keys[lo] == key ? int(lo) : -1;
}

uint home[K];      // the query's cell
// Per indexed dimension a, which of home-1, home, home+1 hold points (bits 0, 1, 2): the
// paper's O_a ∩ M_a.
uint adj_bits[K];

// The r-th (0..2) adjacent coordinate selected by `bits` around `h`.
uint nth_adjacent(uint h, uint bits, uint r) {
    uint first = findLSB(bits);
    uint second = findLSB(bits & ~(1u << first));
    uint off = r == 0u ? first : (r == 1u ? second : uint(findMSB(bits)));
    return h + off - 1u;
}

// Scans cell `cell` from position `from` on (self-join home cell: after the query), or
// from `resume - 1` when resuming an interrupted scan.
void scan_cell(int cell, uint from, uint resume) {
    uvec2 r = cell_ranges[cell];
    uint begin = max(r.x, from);
    bool windowed = (pc.flags & FLAG_SORTIDU) != 0u;
    if (resume != 0u) {
        begin = resume - 1u;
    } else if (windowed) {
        // First position whose SORT_DIM difference is >= -window (differences are
        // monotone in the sorted coordinate).
        uint lo = r.x, hi = r.y;
        while (lo < hi) {
            uint mid = (lo + hi) >> 1;
            T diff = r_coords[mid * DIM + SORT_DIM] - qp[SORT_DIM];
            if (diff < -pc.window) lo = mid + 1u; else hi = mid;
        }
        begin = max(lo, from);
    }
    scan_positions(begin, r.y, windowed);
}

// Probes the cell of mixed-radix combination `combo`: dimension a < fixed_from takes the
// (digit)-th adjacent coordinate (dimension j without home: unicomp); the others stay home.
void probe(uint combo, uint j, uint fixed_from, uint resume) {
    if (!charge(K + 2u * pc.log_cells)) {
        stop_pos = 0u;
        return;
    }
    uint64_t key = 0ul;
    for (uint a = 0u; a < K; a++) {
        uint c = home[a];
        if (a < fixed_from) {
            uint bits = a == j ? adj_bits[a] & ~2u : adj_bits[a];
            uint n = uint(bitCount(bits));
            c = nth_adjacent(home[a], bits, combo % n);
            combo /= n;
        }
        key = key * uint64_t(cells_per_dim(a)) + uint64_t(c);
    }
    int cell = find_cell(key);
    if (cell >= 0) scan_cell(cell, 0u, resume);
}

uint64_t home_key() {
    uint64_t key = 0ul;
    for (uint a = 0u; a < K; a++) key = key * uint64_t(cells_per_dim(a)) + uint64_t(home[a]);
    return key;
}

void main() {
    uint thread = linear_invocation();
    if (thread >= pc.q_count) return;
    uvec4 state = states[thread];
    if (state.x == DONE) return;
    uint qpos = pc.q_begin + thread * pc.q_stride;
    load_query(qpos);
    q_id = q_ids[qpos];
    if ((pc.flags & FLAG_DOT_FILTER) != 0u) load_query_dot(q_id);
    matches_seen = state.w;
    stopped = false;
    stop_pos = 0u;
    // Loading the query (and its filter copy), building the masks (3 binary searches per
    // dimension) and counting the adjacent cells.
    used = ((pc.flags & FLAG_DOT_FILTER) != 0u ? 2u : 1u) * DIM + K * (3u * pc.log_cells + 2u);
    bool self_join = (pc.flags & FLAG_SELF) != 0u;

    for (uint a = 0u; a < K; a++) {
        home[a] = q_cells[qpos * K + a];
        uint bits = 0u;
        if (home[a] > 0u && mask_has(a, home[a] - 1u)) bits |= 1u;
        if (mask_has(a, home[a])) bits |= 2u;
        if (home[a] + 1u < cells_per_dim(a) && mask_has(a, home[a] + 1u)) bits |= 4u;
        adj_bits[a] = bits;
    }

    uint phase = state.x;
    uint combo = state.y;
    uint resume = state.z;
    if (!self_join) {
        // A ⋈ B: every adjacent non-empty cell, home included.
        uint total = 1u;
        for (uint a = 0u; a < K; a++) total *= uint(bitCount(adj_bits[a]));
        while (combo < total && !stopped) {
            probe(combo, K, K, resume);
            if (!stopped) {
                combo++;
                resume = 0u;
            }
        }
    } else {
        if (phase == 0u) {
            // Home cell: only positions after the query's own (each pair once).
            if (charge(2u * pc.log_cells + K)) {
                scan_cell(find_cell(home_key()), qpos + 1u, resume);
            } else {
                stop_pos = resume;
            }
            if (!stopped) {
                phase = 1u;
                combo = 0u;
                resume = 0u;
            }
        }
        // unicomp: for each dimension j where the home coordinate is odd, the cells that
        // differ from home in j, equal it above j, and take any adjacent coordinate below j.
        while (phase <= K && !stopped) {
            uint j = phase - 1u;
            if ((home[j] & 1u) == 1u && charge(j + 1u)) {
                uint total = uint(bitCount(adj_bits[j] & ~2u));
                for (uint a = 0u; a < j; a++) total *= uint(bitCount(adj_bits[a]));
                while (combo < total && !stopped) {
                    probe(combo, j, j + 1u, resume);
                    if (!stopped) {
                        combo++;
                        resume = 0u;
                    }
                }
            }
            if (!stopped) {
                phase++;
                combo = 0u;
                resume = 0u;
            }
        }
    }
    flush_dot_counts();
    if (stopped) {
        counters[1] = 1u;
        states[thread] = uvec4(phase, combo, stop_pos, matches_seen);
    } else {
        states[thread] = uvec4(DONE, 0u, 0u, matches_seen);
    }
}
