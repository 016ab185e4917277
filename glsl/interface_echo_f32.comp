#version 460
#define T float
#define TBITS(x) uvec2(floatBitsToUint(x), 0u)
#include "interface_echo.glsl"
