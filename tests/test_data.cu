// test_data.cu: the IDX reader and the MNIST-style loader. Every malformed input is crafted here
// (plain files, and gzip files written with zlib's gzopen) in a temporary directory: bad magic,
// unknown type code, rank 0, truncated header, dimensions against the data size, truncated, corrupt
// and trailing-garbage gzip, count mismatch, images not 28x28, labels out of range, missing
// directory and files. Each must give a dualcast::Error naming the file and the problem; truncating
// a valid file at every length must never crash nor return data. The real Fashion-MNIST files are
// checked when the Debian package is installed, the small copy in tests/data/ always.
#include <gtest/gtest.h>
#include <zlib.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dualcast/data.hpp"
#include "dualcast/error.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using dualcast::Error;
using namespace dualcast::data;

namespace {

using Bytes = std::vector<std::uint8_t>;

void put_be32(Bytes& b, std::uint32_t v) {
  b.push_back(static_cast<std::uint8_t>(v >> 24));
  b.push_back(static_cast<std::uint8_t>(v >> 16));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
  b.push_back(static_cast<std::uint8_t>(v));
}

/// An IDX file: magic 00 00 type rank, big-endian dims, then `payload` as given.
Bytes idx_file(std::uint8_t type, const std::vector<std::uint32_t>& dims, const Bytes& payload) {
  Bytes b{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims) put_be32(b, d);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

/// n images of rows x cols ubyte, pixel (k, r, c) = (k * 7 + r * 3 + c) % 256.
Bytes image_file(std::uint32_t n, std::uint32_t rows = 28, std::uint32_t cols = 28) {
  Bytes px;
  for (std::uint32_t k = 0; k < n; ++k)
    for (std::uint32_t r = 0; r < rows; ++r)
      for (std::uint32_t c = 0; c < cols; ++c) px.push_back(static_cast<std::uint8_t>((k * 7 + r * 3 + c) % 256));
  return idx_file(0x08, {n, rows, cols}, px);
}

Bytes label_file(const Bytes& labels) {
  return idx_file(0x08, {static_cast<std::uint32_t>(labels.size())}, labels);
}

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dualcast_test_data_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write(const std::string& name, const Bytes& b) const {
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    return path(name);
  }

  /// gzip through zlib's gzopen, as the data sets are shipped.
  std::string write_gz(const std::string& name, const Bytes& b) const {
    gzFile f = gzopen(path(name).c_str(), "wb9");
    EXPECT_NE(f, nullptr);
    if (!b.empty()) EXPECT_EQ(gzwrite(f, b.data(), static_cast<unsigned>(b.size())), static_cast<int>(b.size()));
    EXPECT_EQ(gzclose(f), Z_OK);
    return path(name);
  }

  Bytes read(const std::string& p) const {
    std::ifstream in(p, std::ios::binary);
    return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  fs::path dir_;
};

/// Runs `fn`, expecting a dualcast::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no dualcast::Error thrown (expected one mentioning '" << parts.front() << "')";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace

// ---- read_idx: valid files ----------------------------------------------------------------------

TEST_F(DataFiles, ReadsPlainUbyteRank3) {
  const auto p = write("img", image_file(3, 4, 5));
  const IdxArray a = read_idx(p);
  EXPECT_EQ(a.type, IdxType::u8);
  ASSERT_EQ(a.rank(), 3);
  EXPECT_EQ(a.dims, (std::vector<std::int64_t>{3, 4, 5}));
  EXPECT_EQ(a.numel(), 60);
  ASSERT_EQ(a.bytes.size(), 60u);
  EXPECT_EQ(a.at(0), 0.0);
  EXPECT_EQ(a.at(2 * 20 + 3 * 5 + 4), double((2 * 7 + 3 * 3 + 4) % 256));
}

TEST_F(DataFiles, GzipAndPlainGiveTheSameArray) {
  const Bytes b = image_file(5);
  const IdxArray plain = read_idx(write("a", b));
  const IdxArray gz = read_idx(write_gz("a.gz", b));
  // Recognised by content, not by name: a gzip file without .gz and the reverse both work.
  const IdxArray gz_no_ext = read_idx(write_gz("b", b));
  const IdxArray plain_gz_ext = read_idx(write("c.gz", b));
  for (const IdxArray* x : {&gz, &gz_no_ext, &plain_gz_ext}) {
    EXPECT_EQ(x->dims, plain.dims);
    EXPECT_EQ(x->bytes, plain.bytes);
  }
}

TEST_F(DataFiles, ConcatenatedGzipMembersAreOneStream) {
  const Bytes b = image_file(2, 3, 3);
  const Bytes first(b.begin(), b.begin() + 10), second(b.begin() + 10, b.end());
  Bytes cat = read(write_gz("x1", first));
  const Bytes tail = read(write_gz("x2", second));
  cat.insert(cat.end(), tail.begin(), tail.end());
  const IdxArray a = read_idx(write("cat.gz", cat));
  EXPECT_EQ(a.dims, (std::vector<std::int64_t>{2, 3, 3}));
  EXPECT_EQ(a.bytes, Bytes(b.begin() + 16, b.end()));
}

TEST_F(DataFiles, MultiByteTypesAreBigEndian) {
  {  // int16: -2, 300
    const IdxArray a = read_idx(write("s", idx_file(0x0B, {2}, {0xFF, 0xFE, 0x01, 0x2C})));
    EXPECT_EQ(a.type, IdxType::i16);
    EXPECT_EQ(a.at(0), -2.0);
    EXPECT_EQ(a.at(1), 300.0);
  }
  {  // int32: 0x01020304, -1
    const IdxArray a = read_idx(write("i", idx_file(0x0C, {1, 2}, {1, 2, 3, 4, 0xFF, 0xFF, 0xFF, 0xFF})));
    EXPECT_EQ(a.at(0), double(0x01020304));
    EXPECT_EQ(a.at(1), -1.0);
  }
  {  // float32 1.5 = 0x3FC00000; float64 -2.25 = 0xC002000000000000; int8 -1
    EXPECT_EQ(read_idx(write("f", idx_file(0x0D, {1}, {0x3F, 0xC0, 0, 0}))).at(0), 1.5);
    EXPECT_EQ(read_idx(write("d", idx_file(0x0E, {1}, {0xC0, 0x02, 0, 0, 0, 0, 0, 0}))).at(0), -2.25);
    EXPECT_EQ(read_idx(write("b", idx_file(0x09, {1}, {0xFF}))).at(0), -1.0);
  }
  // Zero-sized dimension: valid, empty.
  EXPECT_EQ(read_idx(write("z", idx_file(0x08, {0, 28, 28}, {}))).numel(), 0);
}

// ---- read_idx: malformed files ------------------------------------------------------------------

TEST_F(DataFiles, BadMagic) {
  Bytes b = image_file(1);
  b[0] = 0x1A;
  const auto p = write("bad-magic", b);
  expect_error([&] { read_idx(p); }, {p, "bad magic", "0x1a000803"});
  // A text file, say an HTML error page saved under the data set's name.
  const auto html = write("page.gz", Bytes{'<', 'h', 't', 'm', 'l', '>'});
  expect_error([&] { read_idx(html); }, {html, "bad magic"});
}

TEST_F(DataFiles, UnknownTypeCode) {
  const auto p = write("type", idx_file(0x0A, {2}, {1, 2}));
  expect_error([&] { read_idx(p); }, {p, "unknown IDX type code 0x0a"});
  const auto gz = write_gz("type.gz", idx_file(0x07, {2}, {1, 2}));
  expect_error([&] { read_idx(gz); }, {gz, "unknown IDX type code 0x07"});
}

TEST_F(DataFiles, RankZeroAndTruncatedHeader) {
  const auto p0 = write("rank0", Bytes{0, 0, 8, 0, 1, 2, 3});
  expect_error([&] { read_idx(p0); }, {p0, "rank 0"});
  // Rank 3 needs 16 header bytes; 9 are there.
  const auto p1 = write("short-header", Bytes{0, 0, 8, 3, 0, 0, 0, 2, 0});
  expect_error([&] { read_idx(p1); }, {p1, "truncated header", "16 header bytes", "has 9"});
  const auto p2 = write("empty", Bytes{});
  expect_error([&] { read_idx(p2); }, {p2, "too short"});
  const auto p3 = write_gz("empty.gz", Bytes{});
  expect_error([&] { read_idx(p3); }, {p3, "too short", "after gunzip"});
}

TEST_F(DataFiles, DimensionsAgainstFileSize) {
  Bytes b = image_file(2);
  b.pop_back();
  const auto p = write("short", b);
  expect_error([&] { read_idx(p); }, {p, "truncated data", "[2, 28, 28]", "1568", "1567"});
  Bytes c = image_file(2);
  c.push_back(0);
  const auto q = write_gz("long.gz", c);
  expect_error([&] { read_idx(q); }, {q, "trailing data", "after gunzip", "1569"});
  // Dimensions whose product overflows 64 bits, and one above 2^31 - 1.
  const auto r = write("huge", idx_file(0x0E, {0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF}, {1, 2, 3}));
  expect_error([&] { read_idx(r); }, {r, "truncated data", "more than 2^61"});
  const auto s = write("neg", idx_file(0x08, {0x80000000u}, {1}));
  expect_error([&] { read_idx(s); }, {s, "dimension 0 is 2147483648"});
}

TEST_F(DataFiles, TruncatedCorruptAndTrailingGzip) {
  const Bytes gz = read(write_gz("ok.gz", image_file(4)));
  ASSERT_GT(gz.size(), 40u);
  const auto cut = write("cut.gz", Bytes(gz.begin(), gz.end() - 6));
  expect_error([&] { read_idx(cut); }, {cut, "truncated gzip"});
  const auto half = write("half.gz", Bytes(gz.begin(), gz.begin() + gz.size() / 2));
  expect_error([&] { read_idx(half); }, {half, "truncated gzip"});
  const auto magic_only = write("magic.gz", Bytes{0x1f, 0x8b});
  expect_error([&] { read_idx(magic_only); }, {magic_only, "truncated gzip"});

  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xFF;  // first byte of the CRC32 trailer
  const auto crc = write("crc.gz", bad_crc);
  expect_error([&] { read_idx(crc); }, {crc, "corrupt gzip", "incorrect data check"});

  Bytes bad_method = gz;
  bad_method[2] = 7;  // compression method must be 8 (deflate)
  const auto method = write("method.gz", bad_method);
  expect_error([&] { read_idx(method); }, {method, "corrupt gzip"});

  Bytes junk = gz;
  junk.insert(junk.end(), {'j', 'u', 'n', 'k'});
  const auto trailing = write("junk.gz", junk);
  expect_error([&] { read_idx(trailing); }, {trailing, "4 bytes of trailing data after the gzip stream"});
}

// Truncating a valid file at every length, plain and gzip: always an Error, never a crash or data.
TEST_F(DataFiles, EveryTruncationIsAnError) {
  const Bytes plain = image_file(2, 5, 4);
  const Bytes gz = read(write_gz("full.gz", plain));
  for (const Bytes* whole : {&plain, &gz}) {
    for (std::size_t n = 0; n < whole->size(); ++n) {
      const Bytes part(whole->begin(), whole->begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_THROW(parse_idx(part, "part"), Error) << "length " << n << " of " << whole->size();
    }
    EXPECT_NO_THROW(parse_idx(*whole, "whole"));
  }
}

// Flipping any one bit of a small gzip file: an Error or (where the bit is in the data) a correct
// parse; the CRC means a damaged payload never comes back silently.
TEST_F(DataFiles, BitFlipsInGzipNeverPassSilently) {
  const Bytes plain = image_file(1, 4, 4);
  const Bytes gz = read(write_gz("flip.gz", plain));
  int errors = 0;
  for (std::size_t i = 0; i < gz.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      Bytes b = gz;
      b[i] ^= static_cast<std::uint8_t>(1u << bit);
      try {
        const IdxArray a = parse_idx(b, "flipped");
        // Only header fields zlib does not check (mtime, flags, OS byte) may change harmlessly.
        EXPECT_EQ(a.bytes, Bytes(plain.begin() + 16, plain.end())) << "byte " << i << " bit " << bit;
      } catch (const Error&) {
        ++errors;
      }
    }
  EXPECT_GT(errors, static_cast<int>(gz.size()) * 4);
}

TEST_F(DataFiles, MissingFileAndDirectoryAsFile) {
  const auto p = path("nothing-here");
  expect_error([&] { read_idx(p); }, {p, "no such file"});
  expect_error([&] { read_idx(dir_.string()); }, {dir_.string(), "is a directory"});
}

// ---- load_idx_pair and load_fashion_mnist ------------------------------------------------------

TEST_F(DataFiles, LoadsImagesAndLabels) {
  const auto img = write_gz("i.gz", image_file(3));
  const auto lab = write("l", label_file({9, 0, 4}));
  const Dataset d = load_idx_pair(img, lab);
  EXPECT_EQ(d.size(), 3);
  EXPECT_EQ(d.images.shape(), (dualcast::Shape{3, 784}));
  EXPECT_EQ(d.images.dtype(), dualcast::DType::float32);
  EXPECT_EQ(d.labels.shape(), (dualcast::Shape{3}));
  EXPECT_EQ(d.labels.to_vector<float>(), (std::vector<float>{9, 0, 4}));
  const auto px = d.images.to_vector<float>();
  // image 1, row 2, col 5: (7 + 6 + 5) % 256 = 18.
  EXPECT_FLOAT_EQ(px[784 + 2 * 28 + 5], 18.0f / 255.0f);
  for (float v : px) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LE(v, 1.0f);
  }
  const Dataset same = d.to(dualcast::Device::cpu());
  EXPECT_TRUE(same.images.shares_storage(d.images));
}

TEST_F(DataFiles, CountMismatch) {
  const auto img = write("i", image_file(3));
  const auto lab = write("l", label_file({1, 2}));
  expect_error([&] { load_idx_pair(img, lab); }, {img, lab, "image count 3", "label count 2"});
}

TEST_F(DataFiles, ImagesNot28x28) {
  const auto img = write("i", image_file(2, 32, 32));
  const auto lab = write("l", label_file({1, 2}));
  expect_error([&] { load_idx_pair(img, lab); }, {img, "32x32", "expected 28x28"});
}

TEST_F(DataFiles, WrongRankAndDtype) {
  const auto lab = write("l", label_file({1, 2}));
  const auto flat = write("flat", idx_file(0x08, {2, 784}, Bytes(2 * 784, 0)));
  expect_error([&] { load_idx_pair(flat, lab); }, {flat, "rank 2", "expected rank 3"});
  const auto ints = write("ints", idx_file(0x0C, {1, 28, 28}, Bytes(4 * 784, 0)));
  expect_error([&] { load_idx_pair(ints, lab); }, {ints, "int elements", "0x0c"});
  const auto img = write("i", image_file(2));
  const auto lab2 = write("l2", idx_file(0x08, {2, 1}, {1, 2}));
  expect_error([&] { load_idx_pair(img, lab2); }, {lab2, "rank 2", "expected rank 1"});
  const auto labf = write("lf", idx_file(0x0D, {1}, {0, 0, 0, 0}));
  expect_error([&] { load_idx_pair(img, labf); }, {labf, "float elements"});
  // An images file given as the labels file and the reverse.
  expect_error([&] { load_idx_pair(lab, img); }, {lab, "rank 1", "expected rank 3"});
}

TEST_F(DataFiles, LabelsOutOfRange) {
  const auto img = write("i", image_file(3));
  const auto lab = write("l", label_file({1, 10, 2}));
  expect_error([&] { load_idx_pair(img, lab); }, {lab, "label 10 at index 1", "outside 0..9"});
  const auto lab2 = write("l2", label_file({255, 0, 0}));
  expect_error([&] { load_idx_pair(img, lab2); }, {lab2, "label 255 at index 0"});
}

TEST_F(DataFiles, LoadFashionMnistFindsTheFiles) {
  // Uncompressed train split, gzip test split, MNIST's dotted spelling for one file.
  write("train-images-idx3-ubyte", image_file(4));
  write("train-labels-idx1-ubyte", label_file({0, 1, 2, 3}));
  write_gz("t10k-images-idx3-ubyte.gz", image_file(2));
  write_gz("t10k-labels.idx1-ubyte.gz", label_file({7, 8}));
  const Dataset train = load_fashion_mnist(dir_.string(), true);
  const Dataset test = load_fashion_mnist(dir_.string(), false);
  EXPECT_EQ(train.size(), 4);
  EXPECT_EQ(test.size(), 2);
  EXPECT_EQ(test.labels.to_vector<int>(), (std::vector<int>{7, 8}));
}

TEST_F(DataFiles, LoadFashionMnistMissingDirectoryOrFile) {
  const auto missing = path("no-such-dir");
  expect_error([&] { load_fashion_mnist(missing, true); },
               {missing, "does not exist", "dataset-fashion-mnist"});
  const auto file = write("a-file", Bytes{1});
  expect_error([&] { load_fashion_mnist(file, true); }, {file, "not a directory"});
  write("train-images-idx3-ubyte.gz", Bytes{});  // present (empty: never reached)
  expect_error([&] { load_fashion_mnist(dir_.string(), true); },
               {dir_.string(), "train-labels-idx1-ubyte", "tried"});
  expect_error([&] { load_fashion_mnist(dir_.string(), false); }, {"t10k-images-idx3-ubyte"});
}

// The small real-data copy shipped in tests/data/ (written by Python's gzip, not zlib's gzopen).
TEST(DataShipped, MiniFashionMnist) {
  const char* root = std::getenv("DUALCAST_TEST_DATA");
  const std::string dir = std::string(root ? root : "tests/data") + "/mini-fashion-mnist";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " not found (set DUALCAST_TEST_DATA)";
  const Dataset train = load_fashion_mnist(dir, true);
  const Dataset test = load_fashion_mnist(dir, false);
  EXPECT_EQ(train.size(), 256);
  EXPECT_EQ(test.size(), 128);
  EXPECT_EQ(train.images.shape(), (dualcast::Shape{256, 784}));
  for (float l : train.labels.to_vector<float>()) {
    ASSERT_GE(l, 0.0f);
    ASSERT_LE(l, 9.0f);
  }
}

// The installed Fashion-MNIST (Debian package dataset-fashion-mnist), when present.
TEST(DataInstalled, FashionMnistTestAndTrainSplits) {
  if (!fs::exists(kFashionMnistDir)) GTEST_SKIP() << kFashionMnistDir << " not installed";
  for (bool train : {false, true}) {
    const Dataset d = load_fashion_mnist(kFashionMnistDir, train);
    const std::int64_t n = train ? 60000 : 10000;
    ASSERT_EQ(d.size(), n);
    EXPECT_EQ(d.images.shape(), (dualcast::Shape{n, 784}));
    // Fashion-MNIST is balanced: n / 10 examples of every class in both splits.
    std::vector<int> counts(10, 0);
    for (int l : d.labels.to_vector<int>()) ++counts.at(static_cast<std::size_t>(l));
    for (int c : counts) EXPECT_EQ(c, n / 10);
    const auto px = d.images.to_vector<float>();
    float lo = 1, hi = 0;
    double mean = 0;
    for (float v : px) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      mean += v;
    }
    mean /= static_cast<double>(px.size());
    EXPECT_EQ(lo, 0.0f);
    EXPECT_EQ(hi, 1.0f);
    EXPECT_NEAR(mean, 0.286, 0.01);  // the published mean pixel of Fashion-MNIST
  }
}
