#version 460
#define T double
#define GRID_TILE
#include "join_grid.glsl"
