// Shared helpers for simjoin kernels. Include after `#version 460`:
//     #include "common.glsl"
// It declares the workgroup size as specialization constant 0 (KernelSpec::workgroup_size)
// for 1-D workgroups. Kernels are dispatched by Stream::dispatch_threads, which spreads more
// than maxComputeWorkGroupCount[0] workgroups over a 2-D grid.
#ifndef SIMJOIN_COMMON_GLSL
#define SIMJOIN_COMMON_GLSL

layout(local_size_x_id = 0) in;
// The same specialization constant as a plain uint. Use it, never gl_WorkGroupSize.x in
// arithmetic: glslang 11 folds gl_WorkGroupSize.x to its default (1) in expressions.
layout(constant_id = 0) const uint WORKGROUP_SIZE = 1;

// Linear index of this workgroup in a (possibly 2-D) grid of workgroups.
uint linear_workgroup() {
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

// Linear index of this invocation in a (possibly 2-D) grid of 1-D workgroups.
uint linear_invocation() {
    return linear_workgroup() * WORKGROUP_SIZE + gl_LocalInvocationID.x;
}

#endif
