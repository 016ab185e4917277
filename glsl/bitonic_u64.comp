#version 460
// Bitonic sort stage for u64 keys with u32 values (see bitonic_pairs.glsl, bitonic.glsl).
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#define KEY_T uint64_t
#define KEY_MAX 0xfffffffffffffffful
#include "bitonic_pairs.glsl"
