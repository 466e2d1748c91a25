// Training checkpoints: the model, the optimiser, the learning-rate scheduler, the step, the
// global random state and the user's metadata, saved so that a resumed run continues exactly
// as the uninterrupted one would have.
//
// Note [Checkpoint files]
//   save_checkpoint(path, ...) writes two files, each atomically (Note [Atomic save] in
//   serialize.hpp): `path`, a safetensors file holding the model's state_dict under
//   "model.<key>" and each optimiser buffer under "optimizer.<n>.<buffer>" (n the parameter
//   number, Note [Optimiser state] in optim.hpp), and `path` + ".json", the sidecar: format
//   and version, the step, the optimiser's name, groups, parameter numbers and step counts,
//   the scheduler's name and state, the random state (seed, offset) and the user's metadata.
//   Both carry one random save id; a pair whose ids differ (a save interrupted between the two
//   files, or files of two saves) is refused. Tensors keep their dtypes; PyTorch can read the
//   safetensors file.
//   load_checkpoint() reads and checks everything before it changes anything: the sidecar's
//   format, the ids, the model's keys, shapes and dtypes (a checkpoint of another model is a
//   ShapeError naming the missing and unexpected keys), the optimiser's kind, groups and
//   buffers, the scheduler's kind and group count. Then it copies the parameters in place (so
//   an optimiser built on the model keeps its tensors), loads the optimiser and scheduler
//   state and restores the random state.
//   Resuming gives exactly the losses of the uninterrupted run on the same device when the
//   program's other state (its data order) is a function of the step, as a DataLoader's
//   shuffle is of its seed and epoch.
#pragma once

#include <backplane/export.hpp>
#include <backplane/lr_scheduler.hpp>
#include <backplane/nn.hpp>
#include <backplane/optim.hpp>
#include <backplane/serialize.hpp>

#include <cstdint>
#include <string>

namespace bp {

struct CheckpointInfo {
  int64_t step = 0;   // as given to save_checkpoint
  Metadata metadata;  // the user's
};

// Writes the checkpoint (Note [Checkpoint files]). `scheduler` may be null. ShapeError for a
// parameter that is not initialised; IOError when writing fails (the previous checkpoint at
// `path`, if any, is left whole).
BP_API void save_checkpoint(const std::string& path, const nn::Module& model,
                            const optim::Optimizer& optimizer,
                            const optim::lr_scheduler::LRScheduler* scheduler, int64_t step,
                            const Metadata& metadata = {});

// Restores a checkpoint into `model` (on its devices), `optimizer` and `scheduler` (which may
// be null only when the checkpoint has none; a checkpoint without one leaves a given
// scheduler as it is) and the global random state. Returns the step and metadata. IOError for
// unreadable, malformed or mismatched files; ShapeError / DTypeError for a model that does not
// match; Error for an optimiser or scheduler that does not.
BP_API CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model,
                                      optim::Optimizer& optimizer,
                                      optim::lr_scheduler::LRScheduler* scheduler = nullptr);

// The same with the model given as its state: the tensors themselves by key (what
// Module::state_dict() returns, or a Python module's), which load_checkpoint copies into in
// place. For language bindings whose modules are not nn::Module.
BP_API void save_checkpoint(const std::string& path, const std::map<std::string, Tensor>& model,
                            const optim::Optimizer& optimizer,
                            const optim::lr_scheduler::LRScheduler* scheduler, int64_t step,
                            const Metadata& metadata = {});
BP_API CheckpointInfo load_checkpoint(const std::string& path,
                                      const std::map<std::string, Tensor>& model,
                                      optim::Optimizer& optimizer,
                                      optim::lr_scheduler::LRScheduler* scheduler = nullptr);

}  // namespace bp
