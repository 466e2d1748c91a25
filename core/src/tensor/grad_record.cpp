// The tensor layer's side of recording (Note [Autograd hook] in grad_record.hpp): the grad mode,
// needs_grad, and the call into the autograd layer's recorder.
#include "tensor/grad_record.hpp"

#include "tensor/tensor_internal.hpp"

#include <backplane/errors.hpp>

#include <atomic>

namespace bp {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<autograd::Recorder> g_recorder{nullptr};
}  // namespace

NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) {
  t_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  t_grad_enabled = prev_;
}
GradModeGuard::GradModeGuard(bool enabled) : prev_(t_grad_enabled) {
  t_grad_enabled = enabled;
}
GradModeGuard::~GradModeGuard() {
  t_grad_enabled = prev_;
}
bool grad_enabled() {
  return t_grad_enabled;
}

namespace autograd {

const char* grad_kind_name(GradKind kind) {
  static const char* const names[] = {
#define BP_GRAD_X_NAME(kind, Name) #Name "Backward",
      BP_GRAD_KINDS(BP_GRAD_X_NAME)
#undef BP_GRAD_X_NAME
  };
  return names[static_cast<int>(kind)];
}

bool needs_grad(std::initializer_list<const Tensor*> operands) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : operands) {
    const auto& m = detail::impl(*t).autograd;
    if (m && m->requires_grad) return true;
  }
  return false;
}

void record(GradKind kind, const Tensor& out, std::vector<Tensor> inputs, std::vector<Tensor> saved,
            double scalar, int64_t param, Shape extra) {
  Recorder r = g_recorder.load(std::memory_order_acquire);
  if (!r) [[unlikely]]
    throw Error(std::string("autograd: no recorder registered for ") + grad_kind_name(kind) +
                " (libbackplane's autograd layer was not initialised)");
  r(kind, out, std::move(inputs), std::move(saved), scalar, param, std::move(extra));
}

void set_recorder(Recorder r) noexcept {
  g_recorder.store(r, std::memory_order_release);
}

}  // namespace autograd
}  // namespace bp
