#version 460
#define T double
#define TBITS(x) unpackDouble2x32(x)
#include "interface_echo.glsl"
