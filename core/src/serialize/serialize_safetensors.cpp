// The safetensors format: header parsing and validation (Note [Hostile files] in
// serialize.hpp), in-memory reading, header building.
#include <backplane/runtime.hpp>
#include <backplane/serialize.hpp>

#include <nlohmann/json.hpp>

#include "runtime/files.hpp"
#include "tensor/tensor_sizes.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

namespace bp::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; Backplane's reader and writer assume a "
              "little-endian host");

using nlohmann::json;

namespace {

struct DTypeName {
  std::string_view name;
  DType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"F32", DType::f32}, {"F64", DType::f64}, {"F16", DType::f16}, {"BF16", DType::bf16},
    {"I32", DType::i32}, {"I64", DType::i64}, {"U8", DType::u8},   {"BOOL", DType::boolean}};

[[noreturn]] void fail(std::string_view source, const std::string& msg) {
  throw IOError(std::string(source) + ": " + msg);
}

[[noreturn]] void fail_key(std::string_view source, std::string_view key, const std::string& msg) {
  fail(source, "tensor '" + std::string(key) + "': " + msg);
}

// The JSON value's kind, for messages.
std::string kind(const json& v) {
  return v.type_name();
}

// A non-negative integer no larger than `max`, or a message describing why not.
bool as_unsigned(const json& v, uint64_t max, uint64_t& out, std::string& why) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    if (out > max) {
      why = std::to_string(out) + " is too large";
      return false;
    }
    return true;
  }
  if (v.is_number_integer()) {
    why = std::to_string(v.get<int64_t>()) + " is negative";
    return false;
  }
  why = v.dump() + " is not an integer";
  if (why.size() > 80) why = "a " + kind(v) + " is not an integer";
  return false;
}

std::string offsets_str(const TensorInfo& t) {
  std::string s = "[";  // (built by appending: GCC 12 warns falsely on "[" + std::string)
  s += std::to_string(t.begin);
  s += ", ";
  s += std::to_string(t.end);
  return s + "]";
}

TensorInfo parse_entry(const std::string& key, const json& entry, uint64_t data_bytes,
                       std::string_view source) {
  if (!entry.is_object())
    fail_key(source, key,
             "expected an object with dtype, shape and data_offsets, got a " + kind(entry));
  const json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& [field, value] : entry.items()) {
    if (field == "dtype")
      dtype = &value;
    else if (field == "shape")
      shape = &value;
    else if (field == "data_offsets")
      offsets = &value;
    else
      fail_key(
          source, key,
          "unexpected field '" + field.substr(0, 64) + "' (expected dtype, shape, data_offsets)");
  }
  if (!dtype) fail_key(source, key, "missing field 'dtype'");
  if (!shape) fail_key(source, key, "missing field 'shape'");
  if (!offsets) fail_key(source, key, "missing field 'data_offsets'");

  TensorInfo t;
  t.name = key;
  if (!dtype->is_string()) fail_key(source, key, "dtype must be a string, got a " + kind(*dtype));
  t.dtype = dtype_from_safetensors(dtype->get_ref<const std::string&>(), source, key);

  if (!shape->is_array()) fail_key(source, key, "shape must be an array, got a " + kind(*shape));
  if (shape->size() > static_cast<size_t>(kMaxRank))
    fail_key(source, key,
             "shape has " + std::to_string(shape->size()) +
                 " dimensions; Backplane supports at most " + std::to_string(kMaxRank));
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : *shape) {
    uint64_t v = 0;
    std::string why;
    if (!as_unsigned(d, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), v, why))
      fail_key(source, key, "invalid dimension in shape: " + why);
    t.shape.push_back(static_cast<int64_t>(v));
    overflow |= __builtin_mul_overflow(numel, v, &numel);
  }

  if (!offsets->is_array() || offsets->size() != 2)
    fail_key(source, key,
             "data_offsets must be an array of two integers, got " +
                 (offsets->is_array() ? std::to_string(offsets->size()) + " elements"
                                      : "a " + kind(*offsets)));
  std::string why;
  if (!as_unsigned((*offsets)[0], std::numeric_limits<uint64_t>::max(), t.begin, why) ||
      !as_unsigned((*offsets)[1], std::numeric_limits<uint64_t>::max(), t.end, why))
    fail_key(source, key, "invalid data_offsets: " + why);
  if (t.begin > t.end)
    fail_key(source, key, "data_offsets " + offsets_str(t) + " begin after they end");
  if (t.end > data_bytes)
    fail_key(source, key,
             "data_offsets " + offsets_str(t) + " run past the data section (" +
                 std::to_string(data_bytes) + " bytes)");
  uint64_t nbytes = 0;
  overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes);
  if (overflow || nbytes != t.end - t.begin)
    fail_key(source, key,
             "shape " + detail::shape_list(t.shape, true) + " of " +
                 std::string(dtype_to_safetensors(t.dtype)) + " needs " +
                 (overflow ? std::string("more than 2^64") : std::to_string(nbytes)) +
                 " bytes but data_offsets " + offsets_str(t) + " hold " +
                 std::to_string(t.end - t.begin));
  return t;
}

// Tensors must tile [0, data_bytes) exactly.
void check_tiling(const std::vector<TensorInfo>& tensors, uint64_t data_bytes,
                  std::string_view source) {
  std::vector<const TensorInfo*> order;
  order.reserve(tensors.size());
  for (const TensorInfo& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : order) {
    if (t->begin < at)
      fail_key(source, t->name,
               "data_offsets " + offsets_str(*t) + " overlap tensor '" + prev->name + "' " +
                   offsets_str(*prev));
    if (t->begin > at)
      fail_key(source, t->name,
               "data_offsets " + offsets_str(*t) + " leave bytes [" + std::to_string(at) + ", " +
                   std::to_string(t->begin) + ") of the data section unused");
    at = t->end;
    prev = t;
  }
  if (at != data_bytes)
    fail(source, "the tensors cover " + std::to_string(at) + " bytes but the data section has " +
                     std::to_string(data_bytes) + " (trailing bytes)");
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

void check_header_length(uint64_t n, uint64_t file_bytes, std::string_view source) {
  if (n > kMaxHeaderBytes)
    fail(source, "header length " + std::to_string(n) + " exceeds the limit of " +
                     std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > file_bytes - 8)
    fail(source, "header length " + std::to_string(n) + " runs past the end of the file (" +
                     std::to_string(file_bytes) + " bytes)");
  if (n < 2) fail(source, "header length " + std::to_string(n) + " is too short for a JSON object");
}

void check_values(const TensorInfo& t, const std::byte* data, std::string_view source) {
  if (t.dtype != DType::boolean) return;
  for (uint64_t k = 0; k < t.end - t.begin; ++k)
    if (static_cast<uint8_t>(data[k]) > 1)
      fail_key(source, t.name,
               "BOOL element " + std::to_string(k) + " has byte value " +
                   std::to_string(static_cast<int>(data[k])) + " (must be 0 or 1)");
}

}  // namespace

std::string_view dtype_to_safetensors(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  throw DTypeError("safetensors: no name for dtype " + std::to_string(static_cast<int>(dtype)));
}

DType dtype_from_safetensors(std::string_view name, std::string_view source, std::string_view key) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  std::string shown(name.substr(0, 32));
  fail_key(source, key,
           "unknown or unsupported dtype '" + shown +
               "' (Backplane reads F32 F64 F16 BF16 I32 I64 U8 BOOL)");
}

namespace {
// Note [Hostile files]: a valid header nests three levels (root object, entry object, shape
// array), so a first pass over the text refuses containers opened deeper, and duplicate names
// (which nlohmann would silently merge), before anything is built; the header is then parsed
// without a callback. Both passes are linear: nlohmann-json 3.11's callback parser rescans the
// root object after every entry, which made an 80,000-entry header take minutes.
class HeaderCheck final : public nlohmann::json_sax<json> {
 public:
  explicit HeaderCheck(std::string_view source) : source_(source) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (depth_ == 1 && !names_.insert(k).second)
      fail_key(source_, k, "the name appears twice in the header");
    if (depth_ == 2 && !fields_.insert(k).second)
      fail(source_, "field '" + k.substr(0, 64) + "' appears twice in one header entry");
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(source_, std::string("the header is not valid JSON: ") + e.what());
  }

 private:
  bool open() {
    if (depth_ >= 3) fail(source_, "header JSON nests deeper than a safetensors header can");
    if (depth_ == 1) fields_.clear();
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  std::string_view source_;
  int depth_ = 0;
  std::set<std::string> names_, fields_;
};
}  // namespace

Header parse_header(std::string_view text, uint64_t data_bytes, std::string_view source) {
  HeaderCheck check(source);
  json::sax_parse(text.begin(), text.end(), &check);
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(source, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) fail(source, "the header must be a JSON object, got a " + kind(root));

  Header h;
  h.data_bytes = data_bytes;
  h.header_bytes = text.size();
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail(source, "__metadata__ must be an object of strings, got a " + kind(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(source, "__metadata__ value of '" + mk.substr(0, 64) + "' must be a string, got a " +
                           kind(mv));
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, data_bytes, source));
  }
  check_tiling(h.tensors, data_bytes, source);
  return h;
}

Header parse(std::span<const std::byte> file, std::string_view source) {
  if (file.size() < 8)
    fail(source, "truncated: " + std::to_string(file.size()) +
                     " bytes, but a safetensors file starts with an 8-byte header length");
  uint64_t n = read_le64(file.data());
  check_header_length(n, file.size(), source);
  std::string_view text(reinterpret_cast<const char*>(file.data() + 8), static_cast<size_t>(n));
  Header h = parse_header(text, file.size() - 8 - n, source);
  for (const TensorInfo& t : h.tensors)
    check_values(t, file.data() + h.data_start() + t.begin, source);
  return h;
}

std::map<std::string, Tensor> read(std::span<const std::byte> file, Device& device,
                                   std::string_view source) {
  Header h = parse(file, source);
  std::map<std::string, Tensor> out;
  for (const TensorInfo& t : h.tensors)
    out.emplace(t.name, from_bytes(file.data() + h.data_start() + t.begin, t.end - t.begin, t.shape,
                                   t.dtype, device));
  return out;
}

std::string build_header(const std::vector<TensorInfo>& tensors, const Metadata& metadata) {
  json root = json::object();
  for (const TensorInfo& t : tensors) {
    if (t.name == "__metadata__")
      throw IOError("safetensors: '__metadata__' is reserved and cannot name a tensor");
    root[t.name] = {{"dtype", std::string(dtype_to_safetensors(t.dtype))},
                    {"shape", t.shape},
                    {"data_offsets", {t.begin, t.end}}};
  }
  if (!metadata.empty()) root["__metadata__"] = metadata;
  std::string text;
  try {
    text = root.dump();
  } catch (const json::exception& e) {
    throw IOError(std::string("safetensors: cannot write the header (names and metadata must be "
                              "valid UTF-8): ") +
                  e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// ---- files ----------------------------------------------------------------------------------

namespace {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

// Reads exactly n bytes at `offset`; IOError naming `path` on an error or end of file.
void pread_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(path, "read failed at byte " + std::to_string(offset) + ": " + errno_text(errno));
    }
    if (got == 0)
      fail(path, "unexpected end of file at byte " + std::to_string(offset) +
                     " (the file is truncated or changed while being read)");
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

}  // namespace

Reader::Reader(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below); reads of a
  // regular file ignore the flag.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) fail(path, "cannot open for reading: " + errno_text(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
    if (!S_ISREG(st.st_mode))
      fail(path, std::string("not a regular file (") + detail::file_kind(st.st_mode) + ")");
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < 8)
      fail(path, "truncated: " + std::to_string(size) +
                     " bytes, but a safetensors file starts with an 8-byte header length");
    std::byte prefix[8];
    pread_exact(fd_, prefix, 8, 0, path);
    uint64_t n = read_le64(prefix);
    check_header_length(n, size, path);
    std::string text(static_cast<size_t>(n), '\0');
    pread_exact(fd_, text.data(), n, 8, path);
    header_ = parse_header(text, size - 8 - n, path);
    header_.header_bytes = n;
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* Reader::find(std::string_view name) const {
  auto it = std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != header_.tensors.end() && it->name == name ? &*it : nullptr;
}

Tensor Reader::read(const TensorInfo& info, Device& device) const {
  uint64_t n = info.end - info.begin;
  std::vector<std::byte> bytes(static_cast<size_t>(n));
  if (n) pread_exact(fd_, bytes.data(), n, header_.data_start() + info.begin, path_);
  check_values(info, bytes.data(), path_);
  return from_bytes(bytes.data(), bytes.size(), info.shape, info.dtype, device);
}

}  // namespace bp::safetensors

namespace bp {

std::map<std::string, Tensor> load_file(const std::string& path, Device& device) {
  safetensors::Reader reader(path);
  std::map<std::string, Tensor> out;
  for (const safetensors::TensorInfo& t : reader.header().tensors)
    out.emplace(t.name, reader.read(t, device));
  return out;
}

std::map<std::string, Tensor> load_file(const std::string& path) {
  return load_file(path, default_device());
}

Metadata load_metadata(const std::string& path) {
  return safetensors::Reader(path).header().metadata;
}

}  // namespace bp
