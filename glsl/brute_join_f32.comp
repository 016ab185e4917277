#version 460
#define T float
#include "join_brute.glsl"
