// A grouped cosine tile's pairs out (grouped_tiles.comp, grouped_tiles_coop.comp): the
// includer declares SIDE, the tile's products `sc` (sc[x * SIDE + y], at the scale of
// `floor_value`), the member ids `ida`/`idb`, the `pairs` and `counter` buffers and
// `capacity`. Each pair (x < na, y < nb, x < y on a TRIANGLE tile) whose product reaches
// `floor_value` gets a slot; the workgroup reserves its slots with one atomic on the counter,
// not one a pair: the counter lives in host-visible memory, and on an H200 (2026-11-28)
// about 4 million such atomics a second set the join's time (49 million candidates: about
// 11 s more than the CPU's whole join). The counter always advances; a pair is written only
// below `capacity`, so the host sees a count above it and runs the batch again in parts.
// A pair whose product also reaches `sure_value` has bit 31 of its B position set: the
// cosine rule accepts it for certain (src/cosine.rs `sure_dot`), and the host does not
// confirm it.
#ifndef SIMJOIN_GROUPED_EMIT_GLSL
#define SIMJOIN_GROUPED_EMIT_GLSL

shared uint emit_count;
shared uint emit_base;

bool emit_keeps(uint e, uint na, uint nb, bool tri, float floor_value) {
    uint x = e / SIDE;
    uint y = e % SIDE;
    return x < na && y < nb && (!tri || x < y) && sc[e] >= floor_value;
}

// Called by every invocation of the workgroup (it has barriers), after `sc` is complete
// and visible (a barrier after its writes).
void emit_tile(uint na, uint nb, bool tri, float floor_value, float sure_value) {
    uint lid = gl_LocalInvocationID.x;
    uint mine = 0u;
    for (uint e = lid; e < SIDE * SIDE; e += WORKGROUP_SIZE) {
        if (emit_keeps(e, na, nb, tri, floor_value)) {
            mine++;
        }
    }
    if (lid == 0u) {
        emit_count = 0u;
    }
    barrier();
    uint offset = mine > 0u ? atomicAdd(emit_count, mine) : 0u;
    barrier();
    if (lid == 0u) {
        emit_base = emit_count > 0u ? atomicAdd(counter.v[0], emit_count) : 0u;
    }
    barrier();
    uint slot = emit_base + offset;
    for (uint e = lid; e < SIDE * SIDE; e += WORKGROUP_SIZE) {
        if (emit_keeps(e, na, nb, tri, floor_value)) {
            if (slot < capacity) {
                pairs.v[2u * slot] = ida[e / SIDE];
                pairs.v[2u * slot + 1u] = idb[e % SIDE] | (sc[e] >= sure_value ? 0x80000000u : 0u);
            }
            slot++;
        }
    }
}

#endif
