// The pieces of the DLPack exchange shared by the capsule protocol (dlpack.cpp) and the DLPack
// 1.3 C exchange API (dlpack_c_api.cpp).
#pragma once

#include "bp_python.hpp"

#include <dlpack/dlpack.h>

#include <atomic>
#include <cstdint>
#include <optional>

namespace bp::python::dl {

// Live exports (capsules and managed tensors not yet deleted) and imports (tensors over a
// producer's memory not yet released): backplane._core._dlpack_live.
// Imports are counted only with the GIL held (their release function takes it anyway), so the
// count is a plain integer, not two atomic read-modify-writes per import (Note [DLPack import
// cost] in core/src/tensor/tensor_native.cpp); the free-threaded build counts atomically.
#ifdef Py_GIL_DISABLED
using GilCount = std::atomic<int64_t>;
#else
using GilCount = int64_t;
#endif
extern std::atomic<int64_t> live_exports;
extern GilCount live_imports;

DLDataType to_dl(DType t);
// DTypeError naming `what`, the DLPack type and the dtypes Backplane holds.
DType from_dl(DLDataType d, const char* what = "from_dlpack");

// The Backplane device holding memory that DLPack calls (type, id): cpu:0 for host memory, the
// cuda device of that CUDA ordinal. DeviceError / UnsupportedError naming the device otherwise.
Device& host_device();
Device& device_of(int32_t type, int32_t id);
bool is_host(Device& dev);

// Work queued on `then` after this call waits for the work queued on `first` so far (both
// streams of `dev`): one event per device, recorded and waited on under a mutex, so ordering
// costs no event creation.
void order_streams(Device& dev, Stream& first, Stream& then);

// A tensor over the memory of `m`, whose ownership it takes: the producer's deleter runs once
// (under the GIL) after the last view is gone and the work queued on it is done, or at once
// when the import is refused (a major version other than 1: BufferError; a dtype, rank, stride
// or device Backplane lacks). A read-only tensor is copied (refused with copy=False);
// copy=True copies. No synchronisation with the producer's streams: the caller orders them.
// `dev`: the device of m's memory when the caller has looked it up already (device_of).
Tensor import_versioned(DLManagedTensorVersioned* m, std::optional<bool> copy,
                        Device* dev = nullptr);

// Note [DLPack C exchange API], consumer side: the exchange API of a producer type (its
// __dlpack_c_exchange_api__ capsule, major version 1, required functions present), cached per
// type; nullptr when it has none (the caller falls back to __dlpack__).
const DLPackExchangeAPI* exchange_api_of(PyTypeObject* type);
// A tensor over `obj`'s memory through `api`: the producer's managed tensor, our default stream
// ordered after the producer's current work stream on a device with streams.
Tensor import_through(const DLPackExchangeAPI& api, nb::handle obj, std::optional<bool> copy);

}  // namespace bp::python::dl

namespace bp::python {
// Tensor.__dlpack_c_exchange_api__ and the private helpers of the C exchange API.
void register_dlpack_c_api(nb::class_<Tensor>& cls, nb::module_& m);
}  // namespace bp::python
