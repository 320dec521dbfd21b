// IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or plain, read through zlib.
#ifndef SUMMA_COMMON_IDX_H_
#define SUMMA_COMMON_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace summa {

// An image-classification set in memory: `count` images of rows x cols pixels scaled to [0, 1],
// row-major, and one label in [0, 9] per image.
struct Dataset {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> images;
  std::vector<int32_t> labels;
};

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultDataDir[] = "/usr/share/datasets/fashion-mnist";

// Reads the unsigned-byte IDX file at `path` and checks its magic number and dimension count.
// Every error names the file and says what is wrong (missing, not IDX, truncated, ...).
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};
absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int expected_dims);

// Loads `<dir>/<split>-images-idx3-ubyte[.gz]` and `<dir>/<split>-labels-idx1-ubyte[.gz]` for
// split "train" or "t10k", and checks that they agree.
absl::StatusOr<Dataset> LoadDataset(const std::string& dir, const std::string& split);

}  // namespace summa

#endif  // SUMMA_COMMON_IDX_H_
