#version 460
// LSS kernels for f64 coordinates (see lss.glsl).
#define T double
#define T_BITS(x) unpackDouble2x32(x)
#define T_FROM_BITS(v) packDouble2x32(v)
#define T_WORDS 2u
#include "lss.glsl"
