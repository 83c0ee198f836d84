// data.cpp: the IDX reader (plain or gzip through zlib's inflate) and the MNIST-style loader.
//
// The whole file is read into memory and, when it starts with the gzip magic, inflated in one pass
// with zlib (which checks the CRC and length of every member), so a truncated or corrupt archive is
// told apart from a malformed IDX header. The header is then checked against the data size exactly:
// too few bytes is a truncated file, too many is trailing data; neither is accepted.
#include "dualcast/data.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "dualcast/error.hpp"

namespace dualcast::data {

namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kMaxInflatedBytes = std::uint64_t{1} << 33;  // 8 GiB: far above any IDX set

std::string hex(std::uint64_t v, int digits) {
  std::ostringstream os;
  os << "0x" << std::hex;
  os.width(digits);
  os.fill('0');
  os << v;
  return os.str();
}

std::string dims_str(const std::vector<std::int64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << "]";
  return os.str();
}

std::vector<std::uint8_t> read_file_bytes(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  DUALCAST_CHECK(fs::exists(status), "read_idx: '", path, "': no such file");
  DUALCAST_CHECK(!fs::is_directory(status), "read_idx: '", path, "' is a directory, not an IDX file");
  std::ifstream in(path, std::ios::binary);
  DUALCAST_CHECK(in.good(), "read_idx: '", path, "': cannot open (", std::strerror(errno), ")");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  DUALCAST_CHECK(size >= 0, "read_idx: '", path, "': cannot determine the file size");
  in.seekg(0, std::ios::beg);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
  DUALCAST_CHECK(in.good() || (size == 0 && !in.bad()), "read_idx: '", path,
                 "': read failed after ", in.gcount(), " of ", size, " bytes");
  return bytes;
}

bool is_gzip(const std::vector<std::uint8_t>& b) {
  return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b;
}

/// Inflates every gzip member of `in`. Truncation, corruption, a bad CRC and trailing garbage are
/// errors naming `name`.
std::vector<std::uint8_t> gunzip(const std::vector<std::uint8_t>& in, const std::string& name) {
  std::vector<std::uint8_t> out;
  // The last four bytes hold the uncompressed size mod 2^32: a good first guess for one member.
  if (in.size() >= 18) {
    const std::size_t n = in.size();
    const std::uint32_t isize = static_cast<std::uint32_t>(in[n - 4]) |
                                (static_cast<std::uint32_t>(in[n - 3]) << 8) |
                                (static_cast<std::uint32_t>(in[n - 2]) << 16) |
                                (static_cast<std::uint32_t>(in[n - 1]) << 24);
    if (isize <= (1u << 30)) out.resize(static_cast<std::size_t>(isize) + 1);  // +1: no regrowth
  }

  z_stream zs{};
  DUALCAST_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "read_idx: '", name,
                 "': cannot initialise zlib");
  struct Ender {
    z_stream* z;
    ~Ender() { inflateEnd(z); }
  } ender{&zs};

  std::size_t in_pos = 0;
  std::size_t produced_total = 0;  // bytes of `out` filled
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  int members = 0;
  for (;;) {
    // One gzip member, inflated straight into `out` (grown as needed).
    ++members;
    for (;;) {
      if (zs.avail_in == 0 && in_pos < in.size()) {
        const std::size_t take = std::min(kChunk, in.size() - in_pos);
        zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
        zs.avail_in = static_cast<uInt>(take);
        in_pos += take;
      }
      if (out.size() - produced_total < (std::size_t{1} << 16))
        out.resize(std::max<std::size_t>(out.size() * 2, produced_total + (std::size_t{1} << 20)));
      const std::size_t room = std::min<std::size_t>(out.size() - produced_total, kChunk * 64);
      zs.next_out = out.data() + produced_total;
      zs.avail_out = static_cast<uInt>(room);
      const int ret = inflate(&zs, Z_NO_FLUSH);
      const std::size_t produced = room - zs.avail_out;
      produced_total += produced;
      DUALCAST_CHECK(produced_total <= kMaxInflatedBytes, "read_idx: '", name,
                     "': gzip data inflates to more than ", kMaxInflatedBytes, " bytes");
      if (ret == Z_STREAM_END) break;
      if (ret == Z_DATA_ERROR)
        DUALCAST_FAIL("read_idx: '", name, "': corrupt gzip data in member ", members, " (zlib: ",
                      zs.msg ? zs.msg : "data error", ")");
      if (ret == Z_MEM_ERROR) DUALCAST_FAIL("read_idx: '", name, "': zlib ran out of memory");
      if (ret == Z_NEED_DICT || ret == Z_STREAM_ERROR)
        DUALCAST_FAIL("read_idx: '", name, "': unsupported gzip stream (zlib code ", ret, ")");
      // Z_OK or Z_BUF_ERROR: more input needed, or more room (always given).
      if (zs.avail_in == 0 && in_pos >= in.size() && produced == 0)
        DUALCAST_FAIL("read_idx: '", name, "': truncated gzip file: the compressed stream ends after ",
                      in.size(), " bytes, before its end marker and checksum (", produced_total,
                      " bytes inflated so far)");
    }
    // Anything after the member: another member (concatenated gzip files are valid gzip), or junk.
    const std::size_t rest = zs.avail_in + (in.size() - in_pos);
    if (rest == 0) break;
    const std::size_t at = in.size() - rest;  // == zs.next_in's offset
    const bool more_gzip = rest >= 2 && in[at] == 0x1f && in[at + 1] == 0x8b;
    DUALCAST_CHECK(more_gzip, "read_idx: '", name, "': ", rest,
                   " bytes of trailing data after the gzip stream");
    DUALCAST_CHECK(inflateReset(&zs) == Z_OK, "read_idx: '", name, "': cannot reset zlib");
  }
  out.resize(produced_total);
  return out;
}

std::uint32_t be32(const std::uint8_t* p) {
  return (static_cast<std::uint32_t>(p[0]) << 24) | (static_cast<std::uint32_t>(p[1]) << 16) |
         (static_cast<std::uint32_t>(p[2]) << 8) | static_cast<std::uint32_t>(p[3]);
}

bool known_type(std::uint8_t code) {
  switch (code) {
    case 0x08: case 0x09: case 0x0B: case 0x0C: case 0x0D: case 0x0E: return true;
    default: return false;
  }
}

}  // namespace

const char* idx_type_name(IdxType t) {
  switch (t) {
    case IdxType::u8: return "ubyte";
    case IdxType::i8: return "byte";
    case IdxType::i16: return "short";
    case IdxType::i32: return "int";
    case IdxType::f32: return "float";
    case IdxType::f64: return "double";
  }
  return "unknown";
}

std::size_t idx_type_size(IdxType t) {
  switch (t) {
    case IdxType::u8: case IdxType::i8: return 1;
    case IdxType::i16: return 2;
    case IdxType::i32: case IdxType::f32: return 4;
    case IdxType::f64: return 8;
  }
  return 0;
}

std::int64_t IdxArray::numel() const {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

double IdxArray::at(std::int64_t i) const {
  DUALCAST_CHECK(i >= 0 && i < numel(), "IdxArray::at: index ", i, " out of range for dims ",
                 dims_str(dims));
  const std::uint8_t* p = bytes.data() + static_cast<std::size_t>(i) * idx_type_size(type);
  switch (type) {
    case IdxType::u8: return *p;
    case IdxType::i8: return static_cast<std::int8_t>(*p);
    case IdxType::i16: { std::int16_t v; std::memcpy(&v, p, 2); return v; }
    case IdxType::i32: { std::int32_t v; std::memcpy(&v, p, 4); return v; }
    case IdxType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case IdxType::f64: { double v; std::memcpy(&v, p, 8); return v; }
  }
  DUALCAST_FAIL("IdxArray::at: unknown type");
}

IdxArray parse_idx(const std::vector<std::uint8_t>& file_bytes, const std::string& name) {
  std::vector<std::uint8_t> inflated;
  const bool gz = is_gzip(file_bytes);
  if (gz) inflated = gunzip(file_bytes, name);
  const std::vector<std::uint8_t>& b = gz ? inflated : file_bytes;
  const char* what = gz ? " (after gunzip)" : "";

  DUALCAST_CHECK(b.size() >= 4, "read_idx: '", name, "': ", b.size(), " bytes", what,
                 " is too short for the 4-byte IDX magic number");
  const std::uint32_t magic = be32(b.data());
  DUALCAST_CHECK(b[0] == 0 && b[1] == 0, "read_idx: '", name, "': bad magic number ", hex(magic, 8),
                 what, " (an IDX file starts with two zero bytes, a type code and the rank)");
  DUALCAST_CHECK(known_type(b[2]), "read_idx: '", name, "': unknown IDX type code ", hex(b[2], 2),
                 " in magic ", hex(magic, 8),
                 " (expected 0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int, 0x0D float, 0x0E double)");
  const int rank = b[3];
  DUALCAST_CHECK(rank >= 1, "read_idx: '", name, "': rank 0 in magic ", hex(magic, 8),
                 " (an IDX array needs at least one dimension)");
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  DUALCAST_CHECK(b.size() >= header, "read_idx: '", name, "': truncated header", what, ": rank ",
                 rank, " needs ", header, " header bytes but the file has ", b.size());

  IdxArray a;
  a.type = static_cast<IdxType>(b[2]);
  const std::size_t esize = idx_type_size(a.type);
  const std::uint64_t data_bytes = b.size() - header;
  // The product of the dimensions, refusing overflow: it can never exceed the data actually there.
  std::uint64_t numel = 1;
  bool too_big = false;
  for (int d = 0; d < rank; ++d) {
    const std::uint32_t dim = be32(b.data() + 4 + 4 * d);
    DUALCAST_CHECK(dim <= static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()),
                   "read_idx: '", name, "': dimension ", d, " is ", dim,
                   " (IDX dimensions are signed 32-bit)");
    a.dims.push_back(dim);
    if (dim != 0 && numel > (std::numeric_limits<std::uint64_t>::max() / 8) / dim) too_big = true;
    else numel *= dim;
  }
  if (too_big || numel * esize != data_bytes) {
    std::ostringstream need;
    if (too_big) need << "more than 2^61";
    else need << numel * esize;
    DUALCAST_FAIL("read_idx: '", name, "': ", (too_big || numel * esize > data_bytes)
                                                  ? "truncated data"
                                                  : "trailing data",
                  what, ": dimensions ", dims_str(a.dims), " of ", idx_type_name(a.type),
                  " need ", need.str(), " data bytes after the ", header,
                  "-byte header, but the file has ", data_bytes);
  }

  a.bytes.resize(static_cast<std::size_t>(data_bytes));
  if (a.bytes.empty()) {
    // Zero elements: nothing to copy (and memcpy must not see a null source).
  } else if (esize == 1) {
    std::memcpy(a.bytes.data(), b.data() + header, a.bytes.size());
  } else {
    // Big-endian (file) to the host's order, element by element.
    const std::uint8_t* src = b.data() + header;
    std::uint8_t* dst = a.bytes.data();
    const bool little = [] {
      const std::uint16_t one = 1;
      std::uint8_t first;
      std::memcpy(&first, &one, 1);
      return first == 1;
    }();
    for (std::uint64_t i = 0; i < numel; ++i)
      for (std::size_t k = 0; k < esize; ++k)
        dst[i * esize + k] = little ? src[i * esize + (esize - 1 - k)] : src[i * esize + k];
  }
  return a;
}

IdxArray read_idx(const std::string& path) { return parse_idx(read_file_bytes(path), path); }

Dataset Dataset::to(Device device) const {
  Dataset d = *this;
  d.images = images.to(device);
  d.labels = labels.to(device);
  return d;
}

namespace {

/// Reads one file of an MNIST-style pair (`what`: "images" or "labels") and checks that it holds
/// ubyte elements of the given rank (`dims` names the expected dimensions in the error).
IdxArray read_mnist_file(const std::string& path, const char* what, int rank, const char* dims) {
  IdxArray a = read_idx(path);
  DUALCAST_CHECK(a.type == IdxType::u8, "load: ", what, " file '", path, "' holds ",
                 idx_type_name(a.type), " elements (type code ", hex(static_cast<int>(a.type), 2),
                 "); MNIST-style ", what, " are ubyte (0x08)");
  DUALCAST_CHECK(a.rank() == rank, "load: ", what, " file '", path, "' has rank ", a.rank(),
                 " (dims ", dims_str(a.dims), "); expected rank ", rank, " ", dims);
  return a;
}

}  // namespace

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path) {
  const IdxArray img = read_mnist_file(images_path, "images", 3, "[N, 28, 28]");
  DUALCAST_CHECK(img.dims[1] == 28 && img.dims[2] == 28, "load: images file '", images_path,
                 "' holds images of ", img.dims[1], "x", img.dims[2], " pixels; expected 28x28");
  const IdxArray lab = read_mnist_file(labels_path, "labels", 1, "[N]");
  const std::int64_t n = img.dims[0];
  DUALCAST_CHECK(lab.dims[0] == n, "load: image count ", n, " in '", images_path,
                 "' does not match label count ", lab.dims[0], " in '", labels_path, "'");
  DUALCAST_CHECK(n > 0, "load: '", images_path, "' holds no images");

  constexpr int kClasses = 10;
  std::vector<float> labels(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t v = lab.bytes[static_cast<std::size_t>(i)];
    DUALCAST_CHECK(v < kClasses, "load: labels file '", labels_path, "': label ", int{v},
                   " at index ", i, " is outside 0..", kClasses - 1);
    labels[static_cast<std::size_t>(i)] = static_cast<float>(v);
  }
  const std::int64_t pixels = img.dims[1] * img.dims[2];
  Dataset d;
  d.rows = img.dims[1];
  d.cols = img.dims[2];
  d.num_classes = kClasses;
  d.images = Tensor::empty(Shape{n, pixels}, DType::float32, Device::cpu());
  float* p = d.images.data<float>();
  const std::size_t total = static_cast<std::size_t>(n * pixels);
  for (std::size_t i = 0; i < total; ++i) p[i] = static_cast<float>(img.bytes[i]) * (1.0f / 255.0f);
  d.labels = Tensor::from_vector<float>(Shape{n}, labels);
  return d;
}

std::string find_idx_file(const std::string& dir, const std::string& base) {
  std::vector<std::string> candidates{base, base + ".gz"};
  // The original MNIST distribution spells "train-images.idx3-ubyte".
  if (const auto pos = base.find("-idx"); pos != std::string::npos) {
    std::string dotted = base;
    dotted[pos] = '.';
    candidates.push_back(dotted);
    candidates.push_back(dotted + ".gz");
  }
  std::string tried;
  for (const auto& c : candidates) {
    const fs::path p = fs::path(dir) / c;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
    tried += (tried.empty() ? "" : ", ") + c;
  }
  DUALCAST_FAIL("load: no file for '", base, "' in '", dir, "' (tried ", tried, ")");
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  std::error_code ec;
  DUALCAST_CHECK(fs::exists(dir, ec), "load_fashion_mnist: data directory '", dir,
                 "' does not exist (Fashion-MNIST comes with the Debian package "
                 "dataset-fashion-mnist, in ", kFashionMnistDir, ")");
  DUALCAST_CHECK(fs::is_directory(dir, ec), "load_fashion_mnist: '", dir, "' is not a directory");
  const std::string split = train ? "train" : "t10k";
  const std::string images = find_idx_file(dir, split + "-images-idx3-ubyte");
  const std::string labels = find_idx_file(dir, split + "-labels-idx1-ubyte");
  return load_idx_pair(images, labels);
}

}  // namespace dualcast::data
