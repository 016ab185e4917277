#version 460
// LSS kernels for f32 coordinates (see lss.glsl).
#define T float
#define T_BITS(x) uvec2(floatBitsToUint(x), 0u)
#define T_FROM_BITS(v) uintBitsToFloat((v).x)
#define T_WORDS 1u
#include "lss.glsl"
