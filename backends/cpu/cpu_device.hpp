// Static facts about the one CPU device ("cpu:0": every core and the host memory) and its
// memory figures.
//
// Internal to backends/cpu. Thread-safe: the /proc/cpuinfo facts are read once, memory figures
// at each call.
#ifndef BACKPLANE_CPU_DEVICE_HPP_
#define BACKPLANE_CPU_DEVICE_HPP_

#include <backplane/abi/plugin_abi.h>

#include <cstdint>

namespace bp::cpu {

// Fills name ("<model name> (<threads> threads)"), vendor (vendor_id), total/free memory,
// cores (oneTBB's default concurrency), supports_f64 = 1 and unified_memory = 1.
void fill_device_properties(bp_device_properties& props);

// Physical memory usable by this process in bytes: sysinfo's total RAM, lowered to the cgroup
// (v2) memory.max when one is set.
uint64_t total_memory();

// Memory available now in bytes: /proc/meminfo MemAvailable (sysinfo free RAM when absent),
// lowered to the room left under the cgroup limit.
uint64_t available_memory();

}  // namespace bp::cpu

#endif  // BACKPLANE_CPU_DEVICE_HPP_
