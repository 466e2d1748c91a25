// NVTX 3 ranges around launches, so Nsight Systems and Nsight Compute show Backplane's op names.
//
// Note [NVTX ranges]
//   Every launch is one range in the NVTX domain "backplane", named by the op ("add", "matmul")
//   through a string registered once per op. NVTX 3 is header-only (nvtx3/nvToolsExt.h of the
//   CUDA toolkit): with no tool attached, the first call finds no injection library and every
//   later push and pop returns after one indirect call. Building with -DBP_CUDA_NVTX=OFF removes
//   the ranges altogether.
#pragma once

#include "cuda_kernels.hpp"

#if BP_CUDA_NVTX
#include <nvtx3/nvToolsExt.h>

#include <array>
#endif

namespace bp::cuda {

#if BP_CUDA_NVTX
class NvtxRange {
 public:
  explicit NvtxRange(Op op) noexcept {
    const Names& n = names();
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = n.op[static_cast<size_t>(op)];
    nvtxDomainRangePushEx(n.domain, &a);
  }
  ~NvtxRange() { nvtxDomainRangePop(names().domain); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  struct Names {
    nvtxDomainHandle_t domain;
    std::array<nvtxStringHandle_t, static_cast<size_t>(Op::kCount)> op{};
    Names() : domain(nvtxDomainCreateA("backplane")) {
      for (size_t i = 0; i < op.size(); ++i)
        op[i] = nvtxDomainRegisterStringA(domain, op_name(static_cast<Op>(i)));
    }
  };
  static const Names& names() {
    static const Names n;
    return n;
  }
};
#else
class NvtxRange {
 public:
  explicit NvtxRange(Op) noexcept {}
};
#endif

}  // namespace bp::cuda
