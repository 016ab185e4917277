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

// key * n + c on a 64-bit key held as (lo, hi); the host checked it cannot overflow.
uvec2 key_mul_add(uvec2 key, uint n, uint c) {
    uint hi1, lo1;
    umulExtended(key.x, n, hi1, lo1);
    uint carry;
    uint lo = uaddCarry(lo1, c, carry);
    return uvec2(lo, key.y * n + hi1 + carry);
}

bool key_less(uvec2 a, uvec2 b) { return a.y < b.y || (a.y == b.y && a.x < b.x); }

// Index of the non-empty cell with this key, or -1 (binary search of B).
int find_cell(uvec2 key) {
    uint lo = 0u, hi = pc.n_cells;
    while (lo < hi) {
        uint mid = (lo + hi) >> 1;
        uvec2 v = cell_keys[mid];
        if (v == key) return int(mid);
        if (key_less(v, key)) lo = mid + 1u; else hi = mid;
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

uint coords[K]; // the adjacent cell being probed

void search_cell() {
    uvec2 key = uvec2(0u, 0u);
    for (uint a = 0u; a < K; a++) {
        key = key_mul_add(key, cells_per_dim(a), coords[a]);
    }
    int c = find_cell(key);
    if (c >= 0) {
        uvec2 r = cell_ranges[c];
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

    uint home[K];
    uint adj[K][3];   // O_j ∩ M_j: adjacent coordinates that hold points
    uint n_adj[K];
    for (uint a = 0u; a < K; a++) {
        home[a] = q_cells[qpos * K + a];
        n_adj[a] = 0u;
        uint first = home[a] == 0u ? 0u : home[a] - 1u;
        uint last = min(home[a] + 1u, cells_per_dim(a) - 1u);
        for (uint c = first; c <= last; c++) {
            if (mask_has(a, c)) {
                adj[a][n_adj[a]] = c;
                n_adj[a] += 1u;
            }
        }
    }

    if (!self_join) {
        // A ⋈ B: every adjacent non-empty cell, home included.
        uint total = 1u;
        for (uint a = 0u; a < K; a++) total *= n_adj[a];
        for (uint combo = 0u; combo < total; combo++) {
            uint rest = combo;
            for (int a = int(K) - 1; a >= 0; a--) {
                coords[a] = adj[a][rest % n_adj[a]];
                rest /= n_adj[a];
            }
            search_cell();
        }
        finish_query(thread);
        return;
    }

    // Self-join home cell: only positions after the query's own (each pair once).
    {
        uvec2 key = uvec2(0u, 0u);
        for (uint a = 0u; a < K; a++) key = key_mul_add(key, cells_per_dim(a), home[a]);
        int c = find_cell(key);
        uvec2 r = cell_ranges[c];
        scan_range(r.x, r.y, qpos + 1u);
    }
    // unicomp: for each dimension j where the home coordinate is odd, the cells that differ
    // from home in j, equal it above j, and are any adjacent coordinate below j.
    for (uint j = 0u; j < K; j++) {
        if ((home[j] & 1u) == 0u) continue;
        uint others[2];
        uint n_others = 0u;
        for (uint i = 0u; i < n_adj[j]; i++) {
            if (adj[j][i] != home[j]) {
                others[n_others] = adj[j][i];
                n_others += 1u;
            }
        }
        uint total = n_others;
        for (uint a = 0u; a < j; a++) total *= n_adj[a];
        for (uint combo = 0u; combo < total; combo++) {
            uint rest = combo;
            for (int a = int(K) - 1; a >= 0; a--) {
                if (uint(a) > j) {
                    coords[a] = home[a];
                } else if (uint(a) == j) {
                    coords[a] = others[rest % n_others];
                    rest /= n_others;
                } else {
                    coords[a] = adj[a][rest % n_adj[a]];
                    rest /= n_adj[a];
                }
            }
            search_cell();
        }
    }
    finish_query(thread);
}
