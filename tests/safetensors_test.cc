// common/safetensors.h: a round trip, the layout byte for byte, and every refusal of a reader.
#include "common/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace summa {
namespace {

std::string TempPath(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "safetensors_test_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A file of `json` as its header (unpadded) and `data` as its data section.
std::string File(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

absl::Status OpenStatus(const std::string& bytes) {
  const std::string path = TempPath("bad.safetensors");
  WriteRaw(path, bytes);
  return SafetensorsReader::Open(path).status();
}

const std::vector<TensorSpec> kSpecs = {{"conv1.weight", DType::kFloat32, {2, 1, 3}},
                                        {"conv1.bias", DType::kFloat32, {2}},
                                        {"fc.\"odd\"\\name\n", DType::kFloat32, {}}};

TEST(SafetensorsTest, RoundTripKeepsNamesShapesValuesOrderAndMetadata) {
  const std::string path = TempPath("model.safetensors");
  std::vector<float> flat(9);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = 0.5f * static_cast<float>(i) - 1.25f;
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"summa.version", "42"}, {"note", "a \"quoted\" é"}};
  // Written in three pieces, as the server writes partitions.
  auto writer = SafetensorsWriter::Create(path, kSpecs, metadata);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(absl::MakeConstSpan(flat).subspan(0, 4)).ok());
  ASSERT_TRUE((*writer)->Append(absl::MakeConstSpan(flat).subspan(4, 4)).ok());
  EXPECT_FALSE((*writer)->Finish().ok());  // a value is missing
  ASSERT_TRUE((*writer)->Append(absl::MakeConstSpan(flat).subspan(8)).ok());
  EXPECT_EQ((*writer)->Append(absl::MakeConstSpan(flat).subspan(8)).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<uint64_t> bytes = (*writer)->Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, std::filesystem::file_size(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const SafetensorsHeader& h = (*reader)->header();
  EXPECT_EQ(h.Specs(), kSpecs);
  SafetensorsMetadata sorted = metadata;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(h.metadata, sorted);
  absl::StatusOr<std::vector<float>> read = (*reader)->ReadAllFloat32();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, flat);
}

TEST(SafetensorsTest, LayoutIsLittleEndianLengthPaddedJsonAlignedDataRowMajor) {
  const std::string path = TempPath("layout.safetensors");
  const std::vector<TensorSpec> specs = {{"a", DType::kFloat32, {2, 2}}, {"b", DType::kFloat32, {1}}};
  const std::vector<float> flat = {1, 2, 3, 4, 5};
  ASSERT_TRUE(WriteSafetensors(path, specs, flat, {}).ok());
  const std::string file = ReadAll(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string json = file.substr(8, n);
  const std::string expected =
      R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  EXPECT_EQ(json.substr(0, expected.size()), expected);
  EXPECT_EQ(json.substr(expected.size()), std::string(n - expected.size(), ' '));
  ASSERT_EQ(file.size(), 8 + n + 20);
  std::vector<float> data(5);
  std::memcpy(data.data(), file.data() + 8 + n, 20);
  EXPECT_EQ(data, flat);
  // Every header length gets its padding: names of 1..16 characters.
  for (int len = 1; len <= 16; ++len) {
    absl::StatusOr<std::string> header = EncodeSafetensorsHeader({{std::string(len, 'x'), DType::kFloat32, {1}}}, {});
    ASSERT_TRUE(header.ok());
    EXPECT_EQ(header->size() % 8, 0u) << len;
  }
}

TEST(SafetensorsTest, ReadsF16Bf16AndF64AsFloat32) {
  // 1.5 in each: F16 0x3E00, BF16 0x3FC0, F64.
  std::string data;
  const uint16_t f16 = 0x3E00, bf16 = 0x3FC0;
  const double f64 = 1.5;
  data.append(reinterpret_cast<const char*>(&f16), 2);
  data.append(reinterpret_cast<const char*>(&bf16), 2);
  data.append(reinterpret_cast<const char*>(&f64), 8);
  const std::string json =
      R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]},)"
      R"("d":{"dtype":"F64","shape":[1],"data_offsets":[4,12]}})";
  const std::string path = TempPath("mixed.safetensors");
  WriteRaw(path, File(json, data));
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<std::vector<float>> values = (*reader)->ReadAllFloat32();
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, (std::vector<float>{1.5f, 1.5f, 1.5f}));
}

TEST(SafetensorsTest, AcceptsMetadataAnywhereKeyOrderAndEmptyTensors) {
  const std::string json =
      R"({"b":{"shape":[2],"data_offsets":[4,12],"dtype":"F32"},"__metadata__":{"k":"v"},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"z":{"dtype":"F32","shape":[0,3],"data_offsets":[12,12]}}   )";
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(json, 12);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "a");  // by data offset
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->metadata, (SafetensorsMetadata{{"k", "v"}}));
}

struct Refusal {
  const char* what;
  std::string file;
  absl::StatusCode code;
  const char* says;
};

TEST(SafetensorsTest, RefusesEveryMalformedFileWithAPreciseStatus) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  std::string huge_len(8, '\0');
  const uint64_t big = 1000;
  std::memcpy(huge_len.data(), &big, 8);
  const std::vector<Refusal> cases = {
      {"short file", "abc", absl::StatusCode::kDataLoss, "shorter than the 8-byte header length"},
      {"header past the file", huge_len + "{}", absl::StatusCode::kDataLoss, "runs past the end of the file"},
      {"not an object", File(" {" + ok_entry + "}", eight), absl::StatusCode::kInvalidArgument, "does not begin with '{'"},
      {"array", File("[1]", ""), absl::StatusCode::kInvalidArgument, "does not begin with '{'"},
      {"bad JSON", File("{\"a\":{\"dtype\":\"F32\",}", eight), absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"trailing comma", File("{" + ok_entry + ",}", eight), absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"not UTF-8", File("{\"\xff\":1}", ""), absl::StatusCode::kInvalidArgument, "not UTF-8"},
      {"padding not spaces", File("{" + ok_entry + "}\n", eight), absl::StatusCode::kInvalidArgument,
       "padded with spaces only"},
      {"duplicate names", File("{" + ok_entry + "," + ok_entry + "}", eight + eight), absl::StatusCode::kInvalidArgument,
       "duplicate key \"a\""},
      {"unknown dtype", File(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument, "dtype \"I64\""},
      {"missing field", File(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument, "lacks \"shape\""},
      {"unknown field", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eight),
       absl::StatusCode::kInvalidArgument, "unknown field \"x\""},
      {"shape/offset mismatch", File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument, "needs 12 bytes, but data_offsets [0, 8] hold 8"},
      {"negative dimension", File(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument, "not a non-negative integer"},
      {"fractional offset", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", eight),
       absl::StatusCode::kInvalidArgument, "8.0, not a non-negative integer"},
      {"offset past 2^64", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551624]}})", eight),
       absl::StatusCode::kInvalidArgument, "past 2^64"},
      {"shape overflow", File(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kInvalidArgument, "more than 2^62"},
      {"overlap", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
       absl::StatusCode::kInvalidArgument, "overlap"},
      {"hole", File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", eight + "abcd"),
       absl::StatusCode::kInvalidArgument, "bytes [4, 8) of the data section, before \"b\", belong to no tensor"},
      {"hole at the start", File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
       absl::StatusCode::kInvalidArgument, "bytes [0, 4)"},
      {"bytes after the last tensor", File("{" + ok_entry + "}", eight + "x"), absl::StatusCode::kInvalidArgument,
       "the last 1 of the data section's 9 bytes belong to no tensor"},
      {"data cut short", File("{" + ok_entry + "}", "1234"), absl::StatusCode::kDataLoss, "cut short"},
      {"non-string metadata", File(R"({"__metadata__":{"step":3},)" + ok_entry + "}", eight),
       absl::StatusCode::kInvalidArgument, "__metadata__ \"step\" is a number, not a string"},
      {"metadata not an object", File(R"({"__metadata__":"x",)" + ok_entry + "}", eight),
       absl::StatusCode::kInvalidArgument, "__metadata__ is a string"},
      {"duplicate metadata key", File(R"({"__metadata__":{"k":"1","k":"2"},)" + ok_entry + "}", eight),
       absl::StatusCode::kInvalidArgument, "duplicate key \"k\""},
      {"lone surrogate", File(R"({"\udc00":1})", ""), absl::StatusCode::kInvalidArgument, "lone low surrogate"},
  };
  for (const Refusal& c : cases) {
    const absl::Status s = OpenStatus(c.file);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.what << ": " << s;
    EXPECT_NE(s.message().find("bad.safetensors"), std::string::npos) << c.what << ": " << s;
  }
  EXPECT_EQ(SafetensorsReader::Open(TempPath("absent.safetensors")).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, WriterRefusesNamesTheFormatCannotHold) {
  const std::string path = TempPath("refused.safetensors");
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", DType::kFloat32, {1}}, {"a", DType::kFloat32, {1}}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"__metadata__", DType::kFloat32, {1}}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"", DType::kFloat32, {1}}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", DType::kFloat32, {1}}}, {{"k", "1"}, {"k", "2"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsTest, AnAbandonedWriterLeavesNoFile) {
  const std::string path = TempPath("abandoned.safetensors");
  WriteRaw(path, "old");
  {
    auto writer = SafetensorsWriter::Create(path, kSpecs, {});
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(std::vector<float>(3, 1.0f)).ok());
  }
  EXPECT_EQ(ReadAll(path), "old");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace summa
