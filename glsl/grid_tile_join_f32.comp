#version 460
#define T float
#define GRID_TILE
#include "join_grid.glsl"
