// Saving and loading tensors and module state in the safetensors format, readable and writable
// by PyTorch (safetensors.torch), NumPy (safetensors.numpy) and the Rust safetensors crate.
//
// Note [Safetensors layout]
//   bytes 0..8    N, the header length, unsigned 64-bit little-endian
//   bytes 8..8+N  a JSON object: {"<name>": {"dtype": "F32", "shape": [4, 3],
//                 "data_offsets": [begin, end]}, ..., "__metadata__": {"<str>": "<str>"}}
//                 (__metadata__ optional); padded with spaces to a multiple of 8 when written
//   bytes 8+N..   the data section: each tensor's elements, row-major, little-endian, at
//                 [begin, end) relative to the start of the data section
//   dtypes: F32 F64 F16 BF16 I32 I64 U8 BOOL (one byte, 0 or 1).
//   A valid file's tensors tile the data section exactly: sorted by offset they start at 0,
//   follow each other without gap or overlap, and end at the end of the file.
//
// Note [Hostile files]
//   Reading never trusts the file: the header length is checked against the file size and a
//   100 MB cap before anything is allocated; the JSON may nest at most as deep as a valid
//   header does; every entry must have exactly dtype, shape and data_offsets with the right
//   types (non-negative integer dims, at most BP_MAX_RANK of them; two integer offsets,
//   begin <= end <= data size); the byte size must equal numel * element size (computed with
//   overflow checks); tensors must tile the data section; names may not repeat; BOOL bytes
//   must be 0 or 1. Data is read with bounded reads at checked offsets (no mmap). Every
//   violation is an IOError whose message starts with the file (or the source name given
//   for in-memory parsing) and names the key.
//
// Note [Atomic save]
//   save() writes to a temporary file beside the target, fsyncs it, renames it over the target
//   and fsyncs the folder. If anything fails on the way (a device read, a full disk, a write
//   error) the temporary file is removed and the previous file at `path`, if any, is left as it
//   was; the error is an IOError naming the path and the system's reason.
//   Nothing is left behind when the process dies mid-save (SIGKILL, a crash): where the file
//   system supports O_TMPFILE (ext4, xfs, btrfs, tmpfs) the temporary has no name until it is
//   complete (linkat names it "<path>.tmp.<host>.<pid>.<n>" just before the rename). Elsewhere
//   it is created under that name, and every save first removes the temporaries of `path` that
//   dead processes of the same host left (also the "<path>.tmp.<pid>.<n>" of older versions).
//   A process in another PID namespace on the same host and folder can look dead: its save then
//   fails with an IOError and its target stays intact.
//
// Thread-safety: the functions may run concurrently on different paths; saving a module while
// another thread changes it (to(), load) is a race.
#pragma once

#include <backplane/export.hpp>
#include <backplane/nn.hpp>
#include <backplane/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bp {

using Metadata = std::map<std::string, std::string>;

// Writes the module's state_dict() (keys as in PyTorch: "0.weight") atomically (Note [Atomic
// save]). Throws ShapeError naming the key when a parameter is still uninitialised (a
// LazyLinear that has not run), IOError when writing fails.
BP_API void save(const nn::Module& module, const std::string& path, const Metadata& metadata = {});
// Writes the named tensors (any device, any dtype, any strides) atomically. The name
// "__metadata__" is reserved (IOError); an undefined tensor is an Error naming the key.
BP_API void save(const std::map<std::string, Tensor>& tensors, const std::string& path,
                 const Metadata& metadata = {});

// Loads a file written by save() or by PyTorch/NumPy safetensors into `module`, creating every
// tensor directly on `device` (like torch.load's map_location); uninitialised parameters (a
// LazyLinear that has not run) take their shapes from the file. Checks the file's keys and
// shapes against module.state_spec() before reading data, and reads everything before changing
// the module, so a failure leaves the module as it was. Throws IOError for file problems (Note
// [Hostile files]) and ShapeError, naming the file and the keys, for missing or unexpected keys
// (under options.strict) or a shape that does not fit; DTypeError for a non-floating tensor
// given for a parameter. Tensors whose dtype differs from an initialised parameter's are cast
// to the parameter's dtype.
BP_API nn::LoadResult load(nn::Module& module, const std::string& path, Device& device,
                           const nn::LoadOptions& options = {});
// As above, onto default_device().
BP_API nn::LoadResult load(nn::Module& module, const std::string& path,
                           const nn::LoadOptions& options = {});

// Every tensor of a safetensors file, created on `device`. IOError per Note [Hostile files].
BP_API std::map<std::string, Tensor> load_file(const std::string& path, Device& device);
BP_API std::map<std::string, Tensor> load_file(const std::string& path);  // onto default_device()
// The file's __metadata__ (empty when it has none), reading only the header.
BP_API Metadata load_metadata(const std::string& path);

namespace safetensors {

// Header lengths above this are refused before any allocation.
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

struct Header {
  std::vector<TensorInfo> tensors;  // sorted by name
  Metadata metadata;
  uint64_t header_bytes = 0;  // N
  uint64_t data_bytes = 0;    // size of the data section
  uint64_t data_start() const { return 8 + header_bytes; }
};

// The safetensors dtype string ("F32", "BF16", "BOOL") of a dtype, and back (nullopt-free:
// dtype_from_safetensors throws IOError naming `source` and `key` for an unknown string).
BP_API std::string_view dtype_to_safetensors(DType dtype);
BP_API DType dtype_from_safetensors(std::string_view name, std::string_view source,
                                    std::string_view key);

// Validates a JSON header for a data section of `data_bytes` bytes (Note [Hostile files]).
// `source` (a path, or a description) starts every error message.
BP_API Header parse_header(std::string_view json, uint64_t data_bytes, std::string_view source);

// Validates a whole file held in memory (length prefix, header, offsets, BOOL bytes). Never
// reads outside `file`. This is the entry point of the fuzz target.
BP_API Header parse(std::span<const std::byte> file, std::string_view source);

// Tensors of a whole in-memory file, created on `device`.
BP_API std::map<std::string, Tensor> read(std::span<const std::byte> file, Device& device,
                                          std::string_view source);

// An open safetensors file whose header has been validated (Note [Hostile files]), reading
// tensors one at a time with bounded reads (like safetensors' safe_open). Owns the file
// descriptor; not copyable. Thread-safety: read() may run from several threads at once.
class BP_API Reader {
 public:
  // Opens `path` and validates its length prefix and header. IOError naming the path.
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const noexcept { return path_; }
  const Header& header() const noexcept { return header_; }
  // The entry named `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  // Reads one entry of header() and creates it on `device`. IOError naming the path and key
  // when the file changed underneath (short read) or its bytes are invalid for the dtype.
  Tensor read(const TensorInfo& info, Device& device) const;

 private:
  int fd_ = -1;
  std::string path_;
  Header header_;
};

// The padded JSON header for `tensors` (offsets as given) and `metadata`; writing it after its
// 8-byte length and then the data at those offsets gives a valid file. IOError for a name that
// is not valid UTF-8 or is "__metadata__".
BP_API std::string build_header(const std::vector<TensorInfo>& tensors, const Metadata& metadata);

}  // namespace safetensors

}  // namespace bp
