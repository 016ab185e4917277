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

uint home[K];      // the query's cell (FLAG_TILE: the cell of the group being swept)
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

int combo_cell(uint combo, uint j, uint fixed_from);

// Probes the cell of mixed-radix combination `combo`: dimension a < fixed_from takes the
// (digit)-th adjacent coordinate (dimension j without home: unicomp); the others stay home.
void probe(uint combo, uint j, uint fixed_from, uint resume) {
    if (!charge(K + 2u * pc.log_cells)) {
        stop_pos = 0u;
        return;
    }
    int cell = combo_cell(combo, j, fixed_from);
    if (cell >= 0) scan_cell(cell, 0u, resume);
}

// The non-empty cell of mixed-radix combination `combo` (see probe), or -1.
int combo_cell(uint combo, uint j, uint fixed_from) {
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
    return find_cell(key);
}

// The query's home cell and, per indexed dimension, which adjacent coordinates hold points.
void load_home(uint qpos) {
    for (uint a = 0u; a < K; a++) {
        home[a] = q_cells[qpos * K + a];
        uint bits = 0u;
        if (home[a] > 0u && mask_has(a, home[a] - 1u)) bits |= 1u;
        if (mask_has(a, home[a])) bits |= 2u;
        if (home[a] + 1u < cells_per_dim(a) && mask_has(a, home[a] + 1u)) bits |= 4u;
        adj_bits[a] = bits;
    }
}

uint64_t home_key() {
    uint64_t key = 0ul;
    for (uint a = 0u; a < K; a++) key = key * uint64_t(cells_per_dim(a)) + uint64_t(home[a]);
    return key;
}

// The cells (mixed-radix combinations) of `phase` around home: A ⋈ B's one phase, every
// adjacent non-empty cell; a self-join's phase 1 + j, the unicomp cells of dimension j
// (none where home[j] is even).
uint phase_combos(uint phase, bool self_join) {
    uint total = 1u;
    if (!self_join) {
        for (uint a = 0u; a < K; a++) total *= uint(bitCount(adj_bits[a]));
        return total;
    }
    uint j = phase - 1u;
    if ((home[j] & 1u) == 0u) return 0u;
    total = uint(bitCount(adj_bits[j] & ~2u));
    for (uint a = 0u; a < j; a++) total *= uint(bitCount(adj_bits[a]));
    return total;
}

// One thread per query (or `lanes` threads, each scanning its share of every cell), each
// in its own cells.
void thread_main() {
    uint thread = linear_invocation();
    uint query = split_lanes(thread);
    if (query >= pc.q_count) return;
    uvec4 state = states[thread];
    if (state.x == DONE) return;
    // A stopped job's queued dispatches end at once (their state kept, as for a stop).
    if (stop_asked()) {
        counters[1] = 1u;
        return;
    }
    uint qpos = pc.q_begin + query * pc.q_stride;
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

    load_home(qpos);

    uint phase = state.x;
    uint combo = state.y;
    uint resume = state.z;
    if (!self_join) {
        // A ⋈ B: every adjacent non-empty cell, home included.
        uint total = phase_combos(0u, false);
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
                uint total = phase_combos(phase, true);
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

// ---- FLAG_TILE: the dot-product filter over candidate tiles in shared memory ----------
// Compiled only into grid_tile_join_*.comp (GRID_TILE): a kernel with shared memory and
// barriers costs software devices such as lavapipe about a third more on every path
// (measured: 20k clustered 16-D points untiled, 0.34-0.35 s -> 0.45-0.46 s), so the
// one-thread-per-query kernel has none.
#ifdef GRID_TILE
// A workgroup takes its queries (consecutive positions, sorted by cell) one home cell at a
// time: the group of queries sharing the lowest pending thread's home cell sweeps that
// cell's neighbourhood together. Per candidate cell, the members' ranges (SORTIDU window,
// home cell after the query, resume point) are united and the candidates' filter copies
// staged in shared memory TILE at a time; each member tests its query (in registers)
// against the tile, and survivors get the exact test. Every thread of the workgroup,
// member or not, helps stage the tiles, so every loop holding a barrier is uniform.
//
// Continuations: states as in thread_main, one per query. The group starts at the least
// (phase, combo, resume) of its members; a member skips what comes before its own state,
// so no pair is tested twice across dispatches. A member whose result slot is taken stops
// alone; the loop budget is decided for the whole workgroup (`group_charge`), and then
// every unfinished member saves the later of its own state and the point reached.

layout(constant_id = 5) const uint TILE = 1u;        // candidates per tile
layout(constant_id = 6) const uint TILE_FLOATS = 1u; // TILE * (DIM + 1) where FLAG_TILE runs
shared float tile_dot[TILE_FLOATS];
shared uint s_stop[2];       // budget exhausted (by group_charge call parity)
shared uint s_leader;        // lowest thread with a pending query
shared uint s_home[K];
shared uint s_adj[K];
shared uint s_key[2];
shared uint s_start[3];      // the group's start (phase, combo, resume)
shared uint s_range[2];      // the united candidate range in one cell

uint tile_charges = 0u;      // group_charge calls so far (the same in every thread)
uint my_phase, my_combo, my_resume; // the query's own state when the dispatch began
bool member;                 // the query is in the group being swept
uint stop_phase, stop_combo; // where a stopped member resumes (with stop_pos)
uint my_home[K];             // the query's own home cell and adjacent bits (home[] and
uint my_adj[K];              // adj_bits[] hold the cell of the group being swept)

// Charges `cost` in every thread (uniform control flow); false in all of them when any
// thread's budget would be exceeded. The flag alternates between two words so that a fast
// thread's next write cannot reach a slow thread still reading this call's.
bool group_charge(uint cost) {
    uint word = tile_charges & 1u;
    tile_charges += 1u;
    // Any thread that sees the stop word stops the whole group (as for the budget).
    if ((pc.budget != 0u && used + cost > pc.budget) || (stop_check_due(cost) && stop_asked())) {
        s_stop[word] = 1u;
    } else {
        used += cost;
    }
    barrier();
    return s_stop[word] == 0u;
}

// (a.x, a.y, a.z) < (b.x, b.y, b.z) lexicographically: points of the sweep.
bool point_before(uvec3 a, uvec3 b) {
    return a.x < b.x || (a.x == b.x && (a.y < b.y || (a.y == b.y && a.z < b.z)));
}

// The workgroup ran out of budget at (phase, combo, resume): each unfinished member
// resumes at the later of that point and its own state.
void halt(uint phase, uint combo, uint resume) {
    if (!member || stopped) return;
    uvec3 own = uvec3(my_phase, my_combo, my_resume);
    uvec3 here = uvec3(phase, combo, resume);
    uvec3 at = point_before(here, own) ? own : here;
    stopped = true;
    stop_phase = at.x;
    stop_combo = at.y;
    stop_pos = at.z;
}

// Sweeps cell `cell` at (phase, combo) in tiles; false when the budget ran out.
bool sweep_cell(int cell, uint phase, uint combo, bool self_join, uint qpos) {
    uint lid = gl_LocalInvocationID.x;
    // The binary searches of the windows.
    if (!group_charge(2u * pc.log_cells + 2u)) {
        halt(phase, combo, 0u);
        return false;
    }
    uvec2 r = cell_ranges[cell];
    bool windowed = (pc.flags & FLAG_SORTIDU) != 0u;
    bool testing = member && !stopped && !point_before(uvec3(phase, combo, 0u), uvec3(my_phase, my_combo, 0u));
    uint lo = r.x, hi = r.y;
    if (testing) {
        if (windowed) {
            // [first position with SORT_DIM difference >= -window, first one > window).
            uint a = r.x, b = r.y;
            while (a < b) {
                uint mid = (a + b) >> 1;
                if (r_coords[mid * DIM + SORT_DIM] - qp[SORT_DIM] < -pc.window) a = mid + 1u; else b = mid;
            }
            lo = a;
            b = r.y;
            while (a < b) {
                uint mid = (a + b) >> 1;
                if (r_coords[mid * DIM + SORT_DIM] - qp[SORT_DIM] <= pc.window) a = mid + 1u; else b = mid;
            }
            hi = a;
        }
        if (self_join && phase == 0u) lo = max(lo, qpos + 1u);
        // Resuming here: what is left of that range (a halt's point may precede it).
        if (phase == my_phase && combo == my_combo && my_resume != 0u) lo = max(lo, my_resume - 1u);
    }
    if (lid == 0u) {
        s_range[0] = DONE;
        s_range[1] = 0u;
    }
    barrier();
    if (testing && lo < hi) {
        atomicMin(s_range[0], lo);
        atomicMax(s_range[1], hi);
    }
    barrier();
    uint begin = s_range[0], end = s_range[1];
    // (The next writes of s_range follow a group_charge barrier: every thread has read.)
    uint passes = 2u + ((pc.flags & FLAG_REORDER) != 0u ? 1u : 0u);
    for (uint base = begin; base < end; base += TILE) {
        uint n = min(TILE, end - base);
        uint words = n * (DIM + 1u);
        // Staging (its barrier also keeps this tile's writes after the last tile's reads)
        // and every member's tests.
        if (!group_charge((words + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE + n * (passes * DIM + 1u))) {
            halt(phase, combo, base + 1u);
            return false;
        }
        for (uint i = lid; i < words; i += WORKGROUP_SIZE) {
            uint c = i / (DIM + 1u);
            tile_dot[i] = r_dot[indexed_id(base + c) * (DIM + 1u) + (i - c * (DIM + 1u))];
        }
        barrier();
        for (uint c = 0u; c < n && testing && !stopped; c++) {
            uint p = base + c;
            if (p < lo || p >= hi || row_skips(p)) continue;
            float dot = 0.0;
            for (uint t = 0u; t < DIM; t++) {
                dot = fma(qf[t], tile_dot[c * (DIM + 1u) + t], dot);
            }
            if (dot_verdict(dot, tile_dot[c * (DIM + 1u) + DIM])) continue;
            if (within_eps(p) && !emit(p)) {
                stop_phase = phase;
                stop_combo = combo;
                stop_pos = p + 1u;
            }
        }
    }
    return true;
}

// Sweeps the group's neighbourhood (home[], adj_bits[] hold the group's cell) from
// (phase, combo, resume), in thread_main's order; false when the budget ran out.
bool sweep(uint phase, uint combo, uint resume, bool self_join, uint qpos) {
    for (;; phase++, combo = 0u, resume = 0u) {
        if (phase > (self_join ? K : 0u)) return true;
        uint total = 1u;
        if (phase > 0u) {
            if (!group_charge(phase)) {
                halt(phase, combo, resume);
                return false;
            }
            total = phase_combos(phase, true);
        } else if (!self_join) {
            total = phase_combos(0u, false);
        }
        for (; combo < total; combo++, resume = 0u) {
            if (!group_charge(K + 2u * pc.log_cells)) {
                halt(phase, combo, resume);
                return false;
            }
            int cell = self_join && phase == 0u ? find_cell(home_key())
                     : combo_cell(combo, self_join ? phase - 1u : K, self_join ? phase : K);
            if (cell >= 0 && !sweep_cell(cell, phase, combo, self_join, qpos)) return false;
        }
    }
    return true;
}

void tile_main() {
    uint lid = gl_LocalInvocationID.x;
    uint thread = linear_invocation();
    uvec4 state = thread < pc.q_count ? states[thread] : uvec4(DONE, 0u, 0u, 0u);
    bool pending = state.x != DONE;
    uint qpos = pc.q_begin + thread;
    bool self_join = (pc.flags & FLAG_SELF) != 0u;
    my_phase = state.x;
    my_combo = state.y;
    my_resume = state.z;
    matches_seen = state.w;
    stopped = false;
    stop_pos = 0u;
    used = 2u * DIM + K * (3u * pc.log_cells + 2u); // as thread_main, in every thread
    uint own_key[2] = uint[2](DONE, DONE);
    if (pending) {
        load_query(qpos);
        q_id = q_ids[qpos];
        load_query_dot(q_id);
        load_home(qpos);
        for (uint a = 0u; a < K; a++) {
            my_home[a] = home[a];
            my_adj[a] = adj_bits[a];
        }
        uint64_t key = home_key();
        own_key = uint[2](uint(key), uint(key >> 32));
    }
    if (lid == 0u) {
        s_stop[0] = 0u;
        s_stop[1] = 0u;
    }
    bool halted = false;
    for (;;) {
        barrier();
        if (lid == 0u) s_leader = DONE;
        barrier();
        if (pending) atomicMin(s_leader, lid);
        barrier();
        uint leader = s_leader;
        if (leader == DONE) break;
        if (lid == leader) {
            for (uint a = 0u; a < K; a++) {
                s_home[a] = my_home[a];
                s_adj[a] = my_adj[a];
            }
            s_key[0] = own_key[0];
            s_key[1] = own_key[1];
            s_start[0] = DONE;
            s_start[1] = DONE;
            s_start[2] = DONE;
        }
        barrier();
        member = pending && own_key[0] == s_key[0] && own_key[1] == s_key[1];
        // The group's start: its members' least state.
        if (member) atomicMin(s_start[0], my_phase);
        barrier();
        if (member && my_phase == s_start[0]) atomicMin(s_start[1], my_combo);
        barrier();
        if (member && my_phase == s_start[0] && my_combo == s_start[1]) atomicMin(s_start[2], my_resume);
        barrier();
        uvec3 start = uvec3(s_start[0], s_start[1], s_start[2]);
        for (uint a = 0u; a < K; a++) {
            home[a] = s_home[a];
            adj_bits[a] = s_adj[a];
        }
        halted = !sweep(start.x, start.y, start.z, self_join, qpos);
        if (member) {
            pending = false;
            if (stopped) {
                counters[1] = 1u;
                states[thread] = uvec4(stop_phase, stop_combo, stop_pos, matches_seen);
            } else {
                states[thread] = uvec4(DONE, 0u, 0u, matches_seen);
            }
        }
        if (halted) break;
    }
    // Queries of groups not reached keep their states and are run again.
    if (pending) counters[1] = 1u;
    flush_dot_counts();
}

void main() {
    // Uniform: every thread of the workgroup takes the same path (the estimation pass's
    // strided queries scan one thread per query).
    if ((pc.flags & FLAG_TILE) != 0u && pc.q_stride == 1u) {
        tile_main();
    } else {
        thread_main();
    }
}

#else

void main() {
    thread_main();
}

#endif
