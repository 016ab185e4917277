// Nested-loop brute force (the papers' GPU baseline): one thread per query point, every
// indexed point compared (self-join: only later positions, so each pair once).
#define DIRECT_IDS
#include "join_common.glsl"

void main() {
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
    q_id = qpos;
    matches_seen = state.w;
    used = DIM;
    stopped = false;
    uint first = (pc.flags & FLAG_SELF) != 0u ? qpos + 1u : 0u;
    if (state.z != 0u) first = state.z - 1u;
    scan_positions(first, pc.n_cells, false);
    if (stopped) {
        counters[1] = 1u;
        states[thread] = uvec4(0u, 0u, stop_pos, matches_seen);
    } else {
        states[thread] = uvec4(DONE, 0u, 0u, matches_seen);
    }
}
