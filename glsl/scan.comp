#version 460
// Exclusive prefix sum, reduce-then-scan: no inter-workgroup communication inside a
// dispatch, so no reliance on forward-progress guarantees Vulkan does not give.
// Each workgroup owns a tile of ITEMS * WORKGROUP_SIZE consecutive elements.
//
// MODE (spec constant 1):
//   0 REDUCE: sums[tile] = sum of the tile's inputs.
//   1 SCAN:   out[i] = bases[tile] + exclusive prefix of the inputs within the tile;
//             with write_total, the invocation holding element n-1 also writes out[n].
// INPUT_U64 (spec constant 2): inputs are u64 (upper levels scan the tile sums), else u32.
// Outputs are u64, so sums of u32 counts cannot overflow. SCAN may run in place on u64
// data: every invocation reads its elements before writing the same elements.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

layout(constant_id = 1) const uint MODE = 0;
layout(constant_id = 2) const bool INPUT_U64 = false;
const uint MODE_REDUCE = 0;
const uint ITEMS = 4;

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer U32s { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer U64s { uint64_t v[]; };

layout(push_constant) uniform Params {
    uint64_t input_addr;
    // REDUCE: the tile sums; SCAN: the output offsets.
    U64s out_values;
    // SCAN: the exclusive tile bases (one per tile); 0 when there is a single tile.
    uint64_t bases_addr;
    uint n;
    uint write_total;
};

shared uint64_t partial[WORKGROUP_SIZE];
const uint RAKES = 16;
shared uint64_t run_total[RAKES];

uint64_t load(uint i) {
    if (i >= n) {
        return 0ul;
    }
    if (INPUT_U64) {
        return U64s(input_addr).v[i];
    }
    return uint64_t(U32s(input_addr).v[i]);
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint tile = linear_workgroup();
    if (tile * WORKGROUP_SIZE * ITEMS >= n) {
        return; // a surplus workgroup of a 2-D grid (uniform: the whole group leaves)
    }
    uint first = (tile * WORKGROUP_SIZE + t) * ITEMS;
    uint64_t items[ITEMS];
    uint64_t sum = 0ul;
    for (uint j = 0; j < ITEMS; j++) {
        items[j] = load(first + j);
        sum += items[j];
    }
    // Inclusive scan of the per-invocation sums by raking, in three barriers: RAKES
    // invocations each scan a run of `run` sums sequentially, one scans the run totals,
    // then every invocation adds the total of the runs before its own.
    partial[t] = sum;
    barrier();
    const uint run = (WORKGROUP_SIZE + RAKES - 1) / RAKES;
    const uint rakes = (WORKGROUP_SIZE + run - 1) / run; // RAKES, or fewer in small groups
    if (t < rakes) {
        uint64_t acc = 0ul;
        for (uint j = t * run; j < min((t + 1) * run, WORKGROUP_SIZE); j++) {
            acc += partial[j];
            partial[j] = acc;
        }
        run_total[t] = acc;
    }
    barrier();
    if (t == 0) {
        uint64_t acc = 0ul;
        for (uint r = 0; r < rakes; r++) {
            uint64_t v = run_total[r];
            run_total[r] = acc; // exclusive
            acc += v;
        }
    }
    barrier();
    partial[t] += run_total[t / run];
    barrier();
    if (MODE == MODE_REDUCE) {
        if (t == WORKGROUP_SIZE - 1) {
            out_values.v[tile] = partial[t];
        }
        return;
    }
    uint64_t running = (t > 0 ? partial[t - 1] : 0ul) + (bases_addr != 0ul ? U64s(bases_addr).v[tile] : 0ul);
    for (uint j = 0; j < ITEMS; j++) {
        uint i = first + j;
        if (i < n) {
            out_values.v[i] = running;
            running += items[j];
            if (write_total != 0 && i == n - 1) {
                out_values.v[n] = running;
            }
        }
    }
}
