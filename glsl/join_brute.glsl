// Nested-loop brute force (the papers' GPU baseline): one thread per query point, every
// indexed point compared (self-join: only later positions, so each pair once).
#include "join_common.glsl"

void main() {
    uint thread = thread_index();
    if (thread >= pc.q_count) return;
    uint qpos = pc.q_begin + thread * pc.q_stride;
    load_query(qpos);
    q_id = qpos;
    matches_seen = 0u;
    uint first = (pc.flags & FLAG_SELF) != 0u ? qpos + 1u : 0u;
    for (uint p = first; p < pc.n_cells; p++) {
        if (within_eps(p)) emit(p);
    }
    finish_query(thread);
}
