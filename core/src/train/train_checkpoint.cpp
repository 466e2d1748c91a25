// Training checkpoints (Note [Checkpoint files] in checkpoint.hpp).
#include <backplane/checkpoint.hpp>
#include <backplane/errors.hpp>

#include "serialize/serialize_internal.hpp"
#include "tensor/tensor_sizes.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace bp {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "backplane-checkpoint";
constexpr int kVersion = 1;
constexpr size_t kMaxSidecarBytes = size_t{16} << 20;

std::string sidecar_path(const std::string& path) {
  return path + ".json";
}

std::string new_save_id() {
  std::random_device rd;
  char text[33];
  std::snprintf(text, sizeof text, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return text;
}

// The sidecar, read with a size bound and parsed; IOError naming the file for anything else.
json read_sidecar(const std::string& path) {
  const std::string side = sidecar_path(path);
  int fd = ::open(side.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw IOError(side + ": cannot open the checkpoint's sidecar: " + std::strerror(errno) +
                  " (save_checkpoint writes it beside " + path + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) > kMaxSidecarBytes) {
    ::close(fd);
    throw IOError(side + ": not a regular file of at most " + std::to_string(kMaxSidecarBytes) +
                  " bytes");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != text.size()) throw IOError(side + ": short read");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw IOError(side + ": not a JSON object (a checkpoint sidecar)");
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || *format != kFormat || !j.contains("version") ||
      !j["version"].is_number_integer())
    throw IOError(side + ": not a Backplane checkpoint sidecar (format '" + kFormat + "')");
  if (j["version"].get<int64_t>() != kVersion)
    throw IOError(side + ": checkpoint version " + std::to_string(j["version"].get<int64_t>()) +
                  "; this library reads version " + std::to_string(kVersion));
  return j;
}

// j[key] of the expected kind, or IOError naming the sidecar and the key.
const json& field(const json& j, const char* key, json::value_t kind, const std::string& side) {
  auto it = j.find(key);
  auto same = [&](const json& v) {
    if (kind == json::value_t::number_integer) return v.is_number_integer();
    if (kind == json::value_t::number_float) return v.is_number();
    return v.type() == kind;
  };
  if (it == j.end() || !same(*it))
    throw IOError(side + ": '" + key + "' is missing or of the wrong type");
  return *it;
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer& optimizer,
                     const optim::lr_scheduler::LRScheduler* scheduler, int64_t step,
                     const Metadata& metadata) {
  for (const nn::StateSpec& s : model.state_spec())
    if (!s.initialized)
      throw ShapeError(path + ": cannot save '" + s.key +
                       "': the parameter is not initialised yet (a lazy layer that has not run)");
  save_checkpoint(path, model.state_dict(), optimizer, scheduler, step, metadata);
}

void save_checkpoint(const std::string& path, const std::map<std::string, Tensor>& model,
                     const optim::Optimizer& optimizer,
                     const optim::lr_scheduler::LRScheduler* scheduler, int64_t step,
                     const Metadata& metadata) {
  const std::string id = new_save_id();
  std::map<std::string, Tensor> tensors;
  for (const auto& [key, t] : model) {
    if (!t.defined())
      throw ShapeError(path + ": cannot save '" + key + "': the tensor is undefined");
    tensors["model." + key] = t;
  }
  const optim::OptimizerStateDict os = optimizer.state_dict();
  json steps = json::object();
  for (const auto& [n, st] : os.state) {
    steps[std::to_string(n)] = st.step;
    for (const auto& [name, t] : st.buffers)
      tensors["optimizer." + std::to_string(n) + "." + name] = t;
  }
  json side = {{"format", kFormat},
               {"version", kVersion},
               {"id", id},
               {"step", step},
               {"optimizer",
                {{"name", os.optimizer},
                 {"param_groups", os.param_groups},
                 {"params", os.params},
                 {"steps", steps}}},
               {"random", {{"seed", get_rng_state().seed}, {"offset", get_rng_state().offset}}},
               {"metadata", metadata}};
  if (scheduler)
    side["scheduler"] = {{"name", scheduler->name()}, {"state", scheduler->state_dict()}};
  save(tensors, path, {{"backplane_checkpoint_id", id}});
  detail::write_file_atomic(sidecar_path(path), side.dump(1) + "\n");
}

CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model,
                               optim::Optimizer& optimizer,
                               optim::lr_scheduler::LRScheduler* scheduler) {
  if (model.has_uninitialized_parameters())
    throw ShapeError(path +
                     ": the model has parameters that are not initialised yet (a lazy "
                     "layer that has not run); run one forward pass before loading");
  return load_checkpoint(path, model.state_dict(), optimizer, scheduler);
}

CheckpointInfo load_checkpoint(const std::string& path, const std::map<std::string, Tensor>& model,
                               optim::Optimizer& optimizer,
                               optim::lr_scheduler::LRScheduler* scheduler) {
  const std::string side_name = sidecar_path(path);
  safetensors::Reader reader(path);
  const json side = read_sidecar(path);
  const json::value_t obj = json::value_t::object, arr = json::value_t::array;
  const json::value_t integer = json::value_t::number_integer;
  const std::string id = field(side, "id", json::value_t::string, side_name).get<std::string>();
  auto meta_id = reader.header().metadata.find("backplane_checkpoint_id");
  if (meta_id == reader.header().metadata.end() || meta_id->second != id)
    throw IOError(path + " and " + side_name +
                  " are not one save (their save ids differ: a save interrupted between the two "
                  "files, or files of two saves)");

  CheckpointInfo info;
  optim::OptimizerStateDict os;
  std::map<std::string, double> sched_state;
  bool has_sched = false;
  std::string sched_name;
  RngState rng;
  try {
    info.step = field(side, "step", integer, side_name).get<int64_t>();
    for (const auto& [k, v] : field(side, "metadata", obj, side_name).items())
      info.metadata[k] = v.get<std::string>();
    const json& o = field(side, "optimizer", obj, side_name);
    os.optimizer = field(o, "name", json::value_t::string, side_name).get<std::string>();
    os.param_groups = field(o, "param_groups", arr, side_name).get<std::vector<optim::Options>>();
    os.params = field(o, "params", arr, side_name).get<std::vector<std::vector<int64_t>>>();
    for (const auto& [k, v] : field(o, "steps", obj, side_name).items()) {
      size_t used = 0;
      const int64_t n = std::stoll(k, &used);
      if (used != k.size() || !v.is_number_integer()) throw IOError("bad step entry '" + k + "'");
      os.state[n].step = v.get<int64_t>();
    }
    const json& r = field(side, "random", obj, side_name);
    rng.seed = field(r, "seed", integer, side_name).get<uint64_t>();
    rng.offset = field(r, "offset", integer, side_name).get<uint64_t>();
    if (side.contains("scheduler")) {
      const json& s = field(side, "scheduler", obj, side_name);
      const std::string name =
          field(s, "name", json::value_t::string, side_name).get<std::string>();
      sched_state = field(s, "state", obj, side_name).get<std::map<std::string, double>>();
      has_sched = true;
      sched_name = name;
    }
  } catch (const json::exception& e) {
    throw IOError(side_name + ": malformed checkpoint sidecar: " + e.what());
  } catch (const std::invalid_argument&) {
    throw IOError(side_name + ": malformed checkpoint sidecar: a parameter number is not one");
  } catch (const std::out_of_range&) {
    throw IOError(side_name + ": malformed checkpoint sidecar: a number is out of range");
  }

  // The model: every key and shape before reading any data.
  std::map<std::string, Tensor> current = model;
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, t] : current) {
    const safetensors::TensorInfo* ti = reader.find("model." + key);
    if (!ti) {
      missing.push_back(key);
      continue;
    }
    if (ti->shape != t.shape())
      throw ShapeError(path + ": '" + key + "' has shape " + detail::shape_list(ti->shape) +
                       " in the checkpoint but the model's is " + detail::shape_list(t.shape()));
    if (is_floating(t.dtype()) != is_floating(ti->dtype))
      throw DTypeError(
          path + ": '" + key + "' is " + std::string(safetensors::dtype_to_safetensors(ti->dtype)) +
          " in the checkpoint but " + std::string(dtype_name(t.dtype())) + " in the model");
  }
  std::vector<const safetensors::TensorInfo*> buffers;
  for (const safetensors::TensorInfo& ti : reader.header().tensors) {
    if (ti.name.rfind("model.", 0) == 0) {
      if (!current.count(ti.name.substr(6))) unexpected.push_back(ti.name.substr(6));
    } else if (ti.name.rfind("optimizer.", 0) == 0) {
      buffers.push_back(&ti);
    } else {
      throw IOError(path + ": unexpected tensor '" + ti.name + "' in a checkpoint");
    }
  }
  if (!missing.empty() || !unexpected.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t k = 0; k < v.size() && k < 8; ++k) s += (k ? ", " : "") + v[k];
      return v.size() > 8 ? s + " and " + std::to_string(v.size() - 8) + " more" : s;
    };
    std::string msg = path + ": the checkpoint is of another model";
    if (!missing.empty()) msg += "; missing in the checkpoint: " + list(missing);
    if (!unexpected.empty()) msg += "; not in the model: " + list(unexpected);
    throw ShapeError(msg);
  }

  if (has_sched) {
    if (!scheduler)
      throw Error(side_name + ": the checkpoint has a " + sched_name +
                  " scheduler's state; pass a scheduler to load it into");
    if (sched_name != scheduler->name())
      throw Error(side_name + ": the checkpoint's scheduler is " + sched_name + ", this one " +
                  scheduler->name());
    if (sched_state.size() != optimizer.param_groups().size() + 1)
      throw Error(side_name + ": the checkpoint's scheduler drives " +
                  std::to_string(sched_state.size() - 1) +
                  " parameter groups, this optimizer has " +
                  std::to_string(optimizer.param_groups().size()));
  }

  // The optimiser's buffers, onto each parameter's device (load_state_dict checks them).
  const std::vector<Tensor> params = optimizer.parameters();
  for (const safetensors::TensorInfo* ti : buffers) {
    const std::string rest = ti->name.substr(10);  // "<n>.<buffer>"
    const size_t dot = rest.find('.');
    size_t used = 0;
    int64_t n = -1;
    try {
      n = std::stoll(rest.substr(0, dot), &used);
    } catch (const std::exception&) {
    }
    if (dot == std::string::npos || used != dot || n < 0 ||
        n >= static_cast<int64_t>(params.size()))
      throw IOError(path + ": optimizer tensor '" + ti->name + "' names no parameter of this " +
                    optimizer.name() + " (it has " + std::to_string(params.size()) + ")");
    os.state[n].buffers[rest.substr(dot + 1)] =
        reader.read(*ti, params[static_cast<size_t>(n)].device());
  }
  std::map<std::string, Tensor> fresh;
  for (const auto& [key, t] : current)
    fresh[key] = reader.read(*reader.find("model." + key), t.device());

  // Everything read and checked; now the changes.
  optimizer.load_state_dict(os);
  if (has_sched) scheduler->load_state_dict(sched_state);
  {
    NoGradGuard no_grad;
    for (auto& [key, t] : current) t.copy_(fresh[key]);
  }
  set_rng_state(rng);
  return info;
}

}  // namespace bp
