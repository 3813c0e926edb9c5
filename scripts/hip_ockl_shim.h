// convgen: compile-check helper for HIP device-only compiles with -nogpulib (no ROCm device
// libraries).  Not part of any emitted kernel.
//
// HIP's threadIdx / blockIdx / blockDim / gridDim call the ROCm device-library functions
// __ockl_get_local_id / _group_id / _local_size / _num_groups.  Without the device libraries
// (Debian ships none built for clang 19) those stay calls to undefined functions, so the ISA
// has s_swappc calls, a call stack, and register/scratch counts that mean nothing.  This header
// defines them with the amdgcn builtins they lower to in ROCm, so the ISA is realistic.
//
// Use:  clang++ -x hip --cuda-device-only -nogpulib ... -include scripts/hip_ockl_shim.h
#pragma once
#include <hip/hip_runtime.h>
#if defined(__HIP_DEVICE_COMPILE__) && __HIP_DEVICE_COMPILE__
extern "C" __device__ __attribute__((const)) size_t __ockl_get_local_id(unsigned int d)
{
    return d == 0 ? __builtin_amdgcn_workitem_id_x()
         : d == 1 ? __builtin_amdgcn_workitem_id_y() : __builtin_amdgcn_workitem_id_z();
}
extern "C" __device__ __attribute__((const)) size_t __ockl_get_group_id(unsigned int d)
{
    return d == 0 ? __builtin_amdgcn_workgroup_id_x()
         : d == 1 ? __builtin_amdgcn_workgroup_id_y() : __builtin_amdgcn_workgroup_id_z();
}
extern "C" __device__ __attribute__((const)) size_t __ockl_get_local_size(unsigned int d)
{
    return d == 0 ? __builtin_amdgcn_workgroup_size_x()
         : d == 1 ? __builtin_amdgcn_workgroup_size_y() : __builtin_amdgcn_workgroup_size_z();
}
extern "C" __device__ __attribute__((const)) size_t __ockl_get_num_groups(unsigned int d)
{
    // The dispatch packet's grid size counts work-items; HIP's gridDim counts workgroups.
    const unsigned int grid = d == 0 ? __builtin_amdgcn_grid_size_x()
                            : d == 1 ? __builtin_amdgcn_grid_size_y() : __builtin_amdgcn_grid_size_z();
    const unsigned int wg = (unsigned int)__ockl_get_local_size(d);
    return (grid + wg - 1) / wg;
}
#endif
