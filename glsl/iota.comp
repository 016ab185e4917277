#version 460
// data[i] = start + i for i < count: index arrays (point ids, sort values).
#include "common.glsl"

layout(set = 0, binding = 0) writeonly buffer Data { uint data[]; };

layout(push_constant) uniform Params {
    uint count;
    uint start;
};

void main() {
    uint i = linear_invocation();
    if (i < count) {
        data[i] = start + i;
    }
}
