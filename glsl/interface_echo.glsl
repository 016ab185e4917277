// Test kernel (tests/kernel_interface.rs): reads the join kernels' interface exactly as they
// declare it (join_common.glsl with the generated join_interface.glsl) and writes back what
// it sees: every push-constant field, every flag, and element 0 of every bound buffer. The
// including file defines T and TBITS(x) (uvec2 bits of a T).
#include "join_common.glsl"

void main() {
    if (linear_invocation() != 0u) {
        return;
    }
    states[0] = uvec4(pc.q_begin, pc.q_count, pc.q_stride, pc.capacity);
    states[1] = uvec4(pc.flags, pc.n_cells, pc.budget, pc.log_cells);
    states[2] = uvec4(TBITS(pc.thr), TBITS(pc.window));
    states[3] = uvec4(TBITS(pc.thr_reject), TBITS(pc.dot_cutoff));
    states[4] = uvec4(FLAG_SELF, FLAG_COUNT, FLAG_SWAP, FLAG_SORTIDU);
    states[5] = uvec4(FLAG_REORDER, FLAG_DOT_FILTER, pc.stop_lo, pc.stop_hi);
    states[6] = uvec4(TBITS(r_coords[0]), TBITS(q_coords[0]));
    states[7] = uvec4(uint(cell_keys[0]), uint(cell_keys[0] >> 32), cell_ranges[0]);
    states[8] = uvec4(r_ids[0], q_ids[0], q_cells[0], meta[0]);
    states[9] = uvec4(counters[0], floatBitsToUint(r_dot[0]), floatBitsToUint(q_dot[0]), 0u);
    states[10] = uvec4(pc.lists, pc.shift, pc.radius, pc.rank_lo);
    states[11] = uvec4(pc.rank_hi, pc.k, FLAG_KNN, FLAG_Q_IDS);
    states[12] = uvec4(TBITS(q_limits[0]), q_radii[0], 0u);
    states[13] = uvec4(link_core[0], link_parent[0], FLAG_LINK, FLAG_TILE);
    states[14] = uvec4(FLAG_ROWS, FLAG_ABOVE, FLAG_NOT_SELF, pc.lanes);
    states[15] = uvec4(pc.reserved, 0u, 0u, 0u);
    results[0] = uvec2(0x5EE0u, 0x5EE1u);
}
