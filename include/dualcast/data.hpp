// data.hpp: reading IDX files (the format of MNIST and Fashion-MNIST), plain or gzip-compressed as
// shipped, and loading an MNIST-style data set into tensors.
//
// Every malformed input is a dualcast::Error whose message names the file and what is wrong with it
// (bad magic, unknown type code, rank, header dimensions against the data size, truncated or corrupt
// gzip, image and label counts that disagree, images not 28x28, labels outside 0..9, a missing
// directory or file); nothing is read past the end of a buffer and no partial data is returned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast::data {

/// The element type codes of the IDX format (third byte of the magic number).
enum class IdxType : std::uint8_t {
  u8 = 0x08,
  i8 = 0x09,
  i16 = 0x0B,
  i32 = 0x0C,
  f32 = 0x0D,
  f64 = 0x0E,
};

/// "ubyte", "byte", "short", "int", "float", "double" (or "unknown").
const char* idx_type_name(IdxType t);
/// Bytes per element of an IDX type (0 for an unknown code).
std::size_t idx_type_size(IdxType t);

/// One IDX file in memory: its element type, its dimensions and its elements, already converted from
/// the file's big-endian order to the host's (`bytes.size() == numel() * idx_type_size(type)`).
struct IdxArray {
  IdxType type = IdxType::u8;
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;

  [[nodiscard]] int rank() const { return static_cast<int>(dims.size()); }
  [[nodiscard]] std::int64_t numel() const;
  /// Element i as double, whatever the type.
  [[nodiscard]] double at(std::int64_t i) const;
};

/// Reads an IDX file. Gzip is recognised by its magic bytes (1f 8b), not by the file name, so both
/// "x-idx3-ubyte" and "x-idx3-ubyte.gz" work either way. Throws dualcast::Error naming `path`.
IdxArray read_idx(const std::string& path);
/// Parses IDX bytes already in memory (uncompressed or gzip); `name` is used in error messages.
IdxArray parse_idx(const std::vector<std::uint8_t>& file_bytes, const std::string& name);

/// An image classification data set on one device.
struct Dataset {
  Tensor images;  ///< [N, rows*cols] float32 in [0, 1]
  Tensor labels;  ///< [N] float32 class indices 0..num_classes-1
  std::int64_t rows = 28;
  std::int64_t cols = 28;
  int num_classes = 10;

  [[nodiscard]] std::int64_t size() const { return labels.defined() ? labels.numel() : 0; }
  /// The same data on `device` (shares storage when already there).
  [[nodiscard]] Dataset to(Device device) const;
};

/// Loads an images file (rank 3, ubyte, [N, 28, 28]) and a labels file (rank 1, ubyte, [N], values
/// 0..9) into a Dataset on the CPU. Checks every property listed at the top of this header.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path);

/// The directory the Debian package dataset-fashion-mnist installs to.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Loads the training (60000) or test (10000) split of Fashion-MNIST (or MNIST: same file names)
/// from `dir`. Each file is looked up as "<split>-images-idx3-ubyte" and "<split>-labels-idx1-ubyte"
/// (split "train" or "t10k"), with or without ".gz"; also accepted are the original MNIST names
/// with a dot ("train-images.idx3-ubyte"). A missing directory or file is an Error naming it.
Dataset load_fashion_mnist(const std::string& dir, bool train);

/// Path of an IDX file of `dir` by base name, trying base, base + ".gz" and the dotted MNIST
/// spelling; throws dualcast::Error listing what was tried when none exists.
std::string find_idx_file(const std::string& dir, const std::string& base);

}  // namespace dualcast::data

namespace dualcast {
// The names the issue uses, at namespace level too.
using data::Dataset;
using data::IdxArray;
using data::load_fashion_mnist;
using data::read_idx;
}  // namespace dualcast
