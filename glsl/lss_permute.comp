#version 460
// Permutations for LSS's index (src/gpu/lss.rs): after the Z-order sort the indexed points
// are renumbered by their position in list 0, so that list 0 is the identity, a list-0
// interval is a run of consecutive points in memory, and a self-join query's partners
// with larger ids are the part of a list-0 interval after its own position. The grid
// index built on the device (src/gpu/device_index.rs) gathers and maps with it too.
// Words of any type move as u32 (f64 coordinates are two words).
//
// MODE (spec constant 1), for i < count:
//   0 INVERT: dst[perm[i]] = i
//   1 GATHER: rows of `width` words: dst[i] = src[perm[i / width] * width + i % width]
//   2 MAP:    dst[i] = perm[src[i]] (in place when dst == src)
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "common.glsl"

layout(constant_id = 1) const uint MODE = 0;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint w[]; };

layout(push_constant) uniform Params {
    Words src;
    Words dst;
    Words perm;
    uint count;
    uint width;
};

void main() {
    uint i = linear_invocation();
    if (i >= count) {
        return;
    }
    if (MODE == 0u) {
        dst.w[perm.w[i]] = i;
    } else if (MODE == 1u) {
        uint row = i / width;
        dst.w[i] = src.w[perm.w[row] * width + (i - row * width)];
    } else {
        dst.w[i] = perm.w[src.w[i]];
    }
}
