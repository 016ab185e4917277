#version 460
#define T double
#include "join_grid.glsl"
