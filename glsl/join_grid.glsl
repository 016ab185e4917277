// The eps-grid search kernel (GPU-SJ Algorithm 1 with unicomp; GPU-JOIN's k < n indexed
// dimensions, SORTIDU and SHORTC). One thread per query point.
#include "join_common.glsl"

uint cells_per_dim(uint a) { return meta[a]; }

bool mask_has(uint a, uint c) {
    uint lo = meta[K + a], hi = meta[K + a + 1u];
    uint base = 2u * K + 1u;
    while (lo < hi) {
        uint mid = (lo + hi) >> 1;
        uint v = meta[base + mid];
        if (v == c) return true;
        if (v < c) lo = mid + 1u; else hi = mid;
    }
    return false;
}

// Index of the non-empty cell with this key, or -1 (binary search of B).
int find_cell(uint64_t key) {
    uint lo = 0u, hi = pc.n_cells;
    while (lo < hi) {
        uint mid = (lo + hi) >> 1;
        uint64_t v = cell_keys[mid];
        if (v == key) return int(mid);
        if (v < key) lo = mid + 1u; else hi = mid;
    }
    return -1;
}

// Compares the query with indexed positions [s, e) (from `from` on), through the SORTIDU
// window when the cells are sorted on SORT_DIM.
void scan_range(uint s, uint e, uint from) {
    if ((pc.flags & FLAG_SORTIDU) != 0u) {
        // First position whose SORT_DIM difference is >= -window (differences are
        // monotone in the sorted coordinate).
        uint lo = s, hi = e;
        while (lo < hi) {
            uint mid = (lo + hi) >> 1;
            T diff = r_coords[mid * DIM + SORT_DIM] - qp[SORT_DIM];
            if (diff < -pc.window) lo = mid + 1u; else hi = mid;
        }
        for (uint p = max(lo, from); p < e; p++) {
            T diff = r_coords[p * DIM + SORT_DIM] - qp[SORT_DIM];
            if (diff > pc.window) break;
            if (within_eps(p)) emit(r_ids[p]);
        }
    } else {
        for (uint p = max(s, from); p < e; p++) {
            if (within_eps(p)) emit(r_ids[p]);
        }
    }
}

uint home[K];      // the query's cell
// Per indexed dimension a, which of home-1, home, home+1 hold points (bits 0, 1, 2): the
// paper's O_a ∩ M_a. Bits instead of coordinate lists keep per-thread memory small.
uint adj_bits[K];

// The r-th adjacent coordinate (in increasing order) selected by `bits` around `h`.
uint nth_adjacent(uint h, uint bits, uint r) {
    for (uint off = 0u; off < 3u; off++) {
        if ((bits & (1u << off)) != 0u) {
            if (r == 0u) return h + off - 1u;
            r--;
        }
    }
    return h;
}

// Probes the cell of mixed-radix combination `combo`: dimension a takes the
// (combo digit)-th coordinate of `choice[a]`. Dimension j's choices exclude home (unicomp);
// dimensions above `fixed_from` stay at home.
void probe(uint combo, uint j, uint fixed_from) {
    uint64_t key = 0ul;
    for (uint a = 0u; a < K; a++) {
        uint c = home[a];
        if (a < fixed_from) {
            uint bits = a == j ? adj_bits[a] & ~2u : adj_bits[a];
            uint n = bitCount(bits);
            c = nth_adjacent(home[a], bits, combo % n);
            combo /= n;
        }
        key = key * uint64_t(cells_per_dim(a)) + uint64_t(c);
    }
    int cell = find_cell(key);
    if (cell >= 0) {
        uvec2 r = cell_ranges[cell];
        scan_range(r.x, r.y, 0u);
    }
}

void main() {
    uint thread = thread_index();
    if (thread >= pc.q_count) return;
    uint qpos = pc.q_begin + thread * pc.q_stride;
    load_query(qpos);
    q_id = q_ids[qpos];
    matches_seen = 0u;
    bool self_join = (pc.flags & FLAG_SELF) != 0u;

    for (uint a = 0u; a < K; a++) {
        home[a] = q_cells[qpos * K + a];
        uint bits = 0u;
        if (home[a] > 0u && mask_has(a, home[a] - 1u)) bits |= 1u;
        if (mask_has(a, home[a])) bits |= 2u;
        if (home[a] + 1u < cells_per_dim(a) && mask_has(a, home[a] + 1u)) bits |= 4u;
        adj_bits[a] = bits;
    }

    if (!self_join) {
        // A ⋈ B: every adjacent non-empty cell, home included.
        uint total = 1u;
        for (uint a = 0u; a < K; a++) total *= bitCount(adj_bits[a]);
        for (uint combo = 0u; combo < total; combo++) probe(combo, K, K);
        finish_query(thread);
        return;
    }

    // Self-join home cell: only positions after the query's own (each pair once).
    {
        uint64_t key = 0ul;
        for (uint a = 0u; a < K; a++) key = key * uint64_t(cells_per_dim(a)) + uint64_t(home[a]);
        uvec2 r = cell_ranges[find_cell(key)];
        scan_range(r.x, r.y, qpos + 1u);
    }
    // unicomp: for each dimension j where the home coordinate is odd, the cells that differ
    // from home in j, equal it above j, and take any adjacent coordinate below j.
    for (uint j = 0u; j < K; j++) {
        if ((home[j] & 1u) == 0u) continue;
        uint total = bitCount(adj_bits[j] & ~2u);
        for (uint a = 0u; a < j; a++) total *= bitCount(adj_bits[a]);
        for (uint combo = 0u; combo < total; combo++) probe(combo, j, j + 1u);
    }
    finish_query(thread);
}
