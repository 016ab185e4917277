#version 460
// Bitonic sort stage for u32 keys with u32 values (see bitonic_pairs.glsl, bitonic.glsl).
#define KEY_T uint
#define KEY_MAX 0xffffffffu
#include "bitonic_pairs.glsl"
