// Checkpoint files and their directory (server/checkpoint/): written as the server writes them,
// read partition by partition in blocks of any size, the newest whole one restored past torn and
// corrupt ones, and every way a file can be cut or damaged refused as DATA_LOSS.
#include "server/checkpoint/checkpoint_dir.h"
#include "server/core/checkpoint_codec.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "tests/checkpoint_fixtures.h"

namespace summa::server {
namespace {

// Writes `c` as the server does: its header, then each partition, as records of its own.
absl::StatusOr<std::string> Write(const std::string& dir, const summa::v1::Checkpoint& c, int keep = 2) {
  summa::v1::Checkpoint header = c;
  header.clear_partitions();
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer, CheckpointWriter::Create(dir, header));
  for (const summa::v1::PartitionCheckpoint& p : c.partitions()) SUMMA_RETURN_IF_ERROR(writer->Append(p));
  return writer->Finish(keep);
}

// Every partition `reader` has left, after its header, as one message.
absl::StatusOr<summa::v1::Checkpoint> ReadAll(CheckpointReader& reader) {
  summa::v1::Checkpoint c = reader.header();
  summa::v1::PartitionCheckpoint p;
  while (true) {
    SUMMA_ASSIGN_OR_RETURN(const bool more, reader.Next(&p));
    if (!more) return c;
    *c.add_partitions() = p;
  }
}

absl::StatusOr<summa::v1::Checkpoint> Read(const std::string& path, size_t block_bytes = size_t{1} << 20) {
  SUMMA_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path, block_bytes));
  return ReadAll(*reader);
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void PutFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void AppendLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// A file around `body` (magic, length, body, CRC) as the first releases wrote one whole.
std::string FileAround(const std::string& body) {
  std::string file("SUMMACK1");
  AppendLe(file, body.size(), 8);
  file += body;
  AppendLe(file, crc32(0L, reinterpret_cast<const Bytef*>(file.data()), file.size()), 4);
  return file;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("summa-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static summa::v1::Checkpoint Make(uint64_t version) {
    summa::v1::Checkpoint c;
    c.set_version(version);
    c.set_world_size(2);
    c.set_optimizer("sgd(lr=" + std::to_string(version) + ")");
    return c;
  }

  std::filesystem::path dir_;
};

// The newest checkpoint in dir_ read whole through RestoreNewestCheckpoint, or nullopt.
std::optional<summa::v1::Checkpoint> LoadNewest(const std::string& dir, std::vector<std::string>* warnings) {
  summa::v1::Checkpoint read;
  auto restored = RestoreNewestCheckpoint(
      dir,
      [&](CheckpointReader& reader) {
        absl::StatusOr<summa::v1::Checkpoint> c = ReadAll(reader);
        if (c.ok()) read = *std::move(c);
        return c.status();
      },
      warnings);
  EXPECT_TRUE(restored.ok()) << restored.status();
  if (!restored.ok() || !restored->has_value()) return std::nullopt;
  EXPECT_EQ((*restored)->header.version(), read.version());
  return read;
}

TEST_F(CheckpointTest, RoundTripsAndKeepsTheNewestTwo) {
  for (uint64_t v : {10, 20, 30}) ASSERT_TRUE(Write(dir_, Make(v)).ok());
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files += e.path().extension() == ".summa";
  EXPECT_EQ(files, 2);
  std::vector<std::string> warnings;
  auto restored = LoadNewest(dir_, &warnings);
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->version(), 30u);
  EXPECT_EQ(restored->optimizer(), Make(30).optimizer());
  EXPECT_TRUE(warnings.empty());
}

TEST_F(CheckpointTest, TornAndCorruptFilesAreIgnoredWithAWarning) {
  ASSERT_TRUE(Write(dir_, Make(10)).ok());
  auto newest = Write(dir_, Make(20));
  ASSERT_TRUE(newest.ok());
  // A crash mid-write of a later checkpoint: a truncated file with a newer name.
  const std::string torn = (dir_ / "ckpt-000000000030.summa").string();
  const std::string bytes = FileBytes(*newest);
  PutFile(torn, bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(Read(torn).status().code(), absl::StatusCode::kDataLoss);
  // A flipped byte in the newest whole file fails its checksum.
  {
    std::fstream f(*newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  EXPECT_NE(Read(*newest).status().message().find("checksum"), absl::string_view::npos) << Read(*newest).status();
  std::vector<std::string> warnings;
  auto restored = LoadNewest(dir_, &warnings);
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->version(), 10u);
  EXPECT_EQ(warnings.size(), 2u);
}

TEST_F(CheckpointTest, EmptyOrMissingDirectoryHasNone) {
  std::vector<std::string> warnings;
  EXPECT_FALSE(LoadNewest(dir_, &warnings).has_value());
}

// A job's directory after runs on other shard counts: FindCheckpointSets finds each count's
// shards, and RestoreNewestForShard picks the newest version of a shard's own files and of every
// set of another count that all of that set's shards keep (its own on a tie), skips a torn one,
// and refuses a set no version of which is whole when it is newer than what it would restore.
TEST_F(CheckpointTest, AShardRestoresTheNewestVersionOfItsOwnOrOfAWholeSetOfAnotherShardCount) {
  const std::string dir = dir_.string();
  auto write = [&](int shard, int shards, uint64_t version) {
    summa::v1::Checkpoint c = Make(version);
    c.set_shard(shard);
    c.set_shards(shards);
    return Write(ShardCheckpointDir(dir, shard, shards), c, /*keep=*/10).status();
  };
  for (uint64_t v : {10, 20}) ASSERT_TRUE(write(0, 2, v).ok());
  ASSERT_TRUE(write(1, 2, 10).ok());  // version 20 of shard 1 lost: the set is whole at 10 only
  ASSERT_TRUE(write(0, 4, 5).ok());
  std::filesystem::create_directories(dir_ / "shard-3-of-2");  // not a shard of 2: not a set's
  std::filesystem::create_directories(dir_ / "shard-01-of-4");
  const std::vector<CheckpointSet> sets = FindCheckpointSets(dir);
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(sets[0].shards, 2);
  EXPECT_EQ(sets[0].dirs, (std::vector<std::string>{ShardCheckpointDir(dir, 0, 2), ShardCheckpointDir(dir, 1, 2)}));
  EXPECT_EQ(sets[0].versions, (std::vector<std::vector<uint64_t>>{{10, 20}, {10}}));
  EXPECT_EQ(sets[0].CommonVersions(), (std::vector<uint64_t>{10}));
  EXPECT_EQ(sets[1].shards, 4);
  EXPECT_TRUE(sets[1].CommonVersions().empty());

  // What shard `shard` of `shards` restores: "own V" or "K shards V", or the error.
  auto restore = [&](int shard, int shards, std::vector<std::string>* warnings) -> std::string {
    std::string got;
    absl::StatusOr<std::optional<RestoredCheckpoint>> restored = RestoreNewestForShard(
        dir, shard, shards,
        [&](CheckpointReader& r) {
          got = absl::StrCat("own ", r.header().version());
          return absl::OkStatus();
        },
        [&](absl::Span<CheckpointReader* const> set) {
          std::vector<std::string> each;
          for (size_t i = 0; i < set.size(); ++i) {
            EXPECT_EQ(set[i]->header().shard(), static_cast<int>(i));
            each.push_back(absl::StrCat(set[i]->header().version()));
          }
          got = absl::StrCat(set.size(), " shards ", absl::StrJoin(each, ","));
          return absl::OkStatus();
        },
        warnings);
    if (!restored.ok()) return std::string(restored.status().message());
    if (!restored->has_value()) return "none";
    EXPECT_EQ((*restored)->from_shards, got.rfind("own", 0) == 0 ? 0 : (*restored)->header.shards());
    return got;
  };
  std::vector<std::string> warnings;
  EXPECT_EQ(restore(0, 4, &warnings), "2 shards 10,10") << "the set's 10 is newer than its own 5";
  EXPECT_EQ(restore(1, 4, &warnings), "2 shards 10,10");
  EXPECT_EQ(restore(1, 2, &warnings), "own 10") << "a shard of 2 restores its own";
  ASSERT_TRUE(write(0, 4, 10).ok());
  EXPECT_EQ(restore(0, 4, &warnings), "own 10") << "its own on a tie";
  EXPECT_EQ(restore(0, 1, &warnings), "2 shards 10,10") << "the set of 4 is not whole, and not newer";
  EXPECT_TRUE(warnings.empty());

  // Shard 0 of 4 ran on to 30 and the others' files are lost: a restore of 10 would lose 20 steps.
  ASSERT_TRUE(write(0, 4, 30).ok());
  const std::string refused = restore(0, 1, &warnings);
  EXPECT_NE(refused.find(absl::StrCat(dir, " holds checkpoints of the job on 4 shards, but no version every one of them "
                                      "keeps (shard 0 keeps 5, 10, 30; shard 1 none (",
                                      ShardCheckpointDir(dir, 1, 4), " is missing or empty); ")),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("newer than version 10, the newest this shard can restore"), std::string::npos) << refused;
  std::filesystem::remove_all(dir_ / "shard-0-of-4");

  // A torn file of the set's newest whole version: skipped with a warning, and the next one used.
  for (int shard : {0, 1}) ASSERT_TRUE(write(shard, 2, 40).ok());
  const std::string torn = CheckpointPath(ShardCheckpointDir(dir, 1, 2), 40);
  PutFile(torn, FileBytes(torn).substr(0, 30));
  EXPECT_EQ(restore(0, 3, &warnings), "2 shards 10,10");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(torn), std::string::npos) << warnings[0];
  // Nothing at all: nothing to restore.
  std::filesystem::remove_all(dir_);
  EXPECT_EQ(restore(0, 3, &warnings), "none");
}

// Three tensors (11 + 5 + 1 floats) in partitions of 3 floats: 6 partitions, the last short,
// under Adam, 2 ranks, async (partitions at different versions).
ServerSnapshot ManyPartitions() {
  ServerSnapshot s;
  s.job = {2, Mode::kAsync, 12, "adam", "adam(lr=0.001)", {"exp_avg", "exp_avg_sq"}};
  s.specs = {{"w", DType::kFloat32, {11}}, {"v", DType::kFloat32, {5}}, {"b", DType::kFloat32, {1}}};
  absl::StatusOr<PartitionMap> map = PartitionMap::Create(s.specs, s.job.partition_bytes);
  for (const PartitionRange& r : map->partitions()) {
    PartitionSnapshot p{r.id, 10 + r.id, 9 + r.id, {}, {{}, {}}, {10 + r.id, 9}};
    for (int64_t i = 0; i < r.length; ++i) {
      p.weights.push_back(r.offset + i + 0.5f);
      p.slots[0].push_back(-(r.offset + i) * 0.25f);
      p.slots[1].push_back((r.offset + i) * 1e-3f);
    }
    s.partitions.push_back(std::move(p));
  }
  s.created = absl::FromUnixSeconds(1700000000);
  return s;
}

void ExpectSamePartitions(const ServerSnapshot& got, const ServerSnapshot& want) {
  ASSERT_EQ(got.partitions.size(), want.partitions.size());
  for (size_t i = 0; i < want.partitions.size(); ++i) {
    EXPECT_EQ(got.partitions[i].id, want.partitions[i].id);
    EXPECT_EQ(got.partitions[i].version, want.partitions[i].version);
    EXPECT_EQ(got.partitions[i].updates, want.partitions[i].updates);
    EXPECT_EQ(got.partitions[i].weights, want.partitions[i].weights);
    EXPECT_EQ(got.partitions[i].slots, want.partitions[i].slots);
    EXPECT_EQ(got.partitions[i].next_steps, want.partitions[i].next_steps);
  }
}

TEST_F(CheckpointTest, EveryPartitionRoundTripsThroughTheStreamedFile) {
  const ServerSnapshot s = ManyPartitions();
  ASSERT_EQ(s.partitions.size(), 6u);
  const summa::v1::Checkpoint c = EncodeCheckpoint(s);
  auto path = Write(dir_, c);
  ASSERT_TRUE(path.ok()) << path.status();
  // Blocks of one byte on up: records and varints split across reads.
  for (size_t block : {size_t{1}, size_t{3}, size_t{7}, size_t{64}, size_t{1} << 20}) {
    SCOPED_TRACE(block);
    auto reader = CheckpointReader::Open(*path, block);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->header().partitions_size(), 0);
    EXPECT_EQ((*reader)->header().version(), 10u);
    auto header = DecodeCheckpointHeader((*reader)->header(), s.job);
    ASSERT_TRUE(header.ok()) << header.status();
    ServerSnapshot back;
    absl::Status decoded = DecodePartitions(*header, **reader, [&](PartitionSnapshot p) {
      back.partitions.push_back(std::move(p));
      return absl::OkStatus();
    });
    ASSERT_TRUE(decoded.ok()) << decoded;
    ExpectSamePartitions(back, s);
    EXPECT_EQ(header->map.specs(), s.specs);
    EXPECT_EQ(header->created, s.created);
  }
}

// Compatibility both ways: a streamed file is byte for byte the file the first releases wrote
// with SerializeToString of the whole message, and such a file reads partition by partition.
TEST_F(CheckpointTest, StreamedAndWholeFilesAreTheSameBytes) {
  const summa::v1::Checkpoint c = EncodeCheckpoint(ManyPartitions());
  std::string body;
  ASSERT_TRUE(c.SerializeToString(&body));
  const std::string old_style = FileAround(body);
  auto path = Write(dir_, c);
  ASSERT_TRUE(path.ok()) << path.status();
  const std::string streamed = FileBytes(*path);
  EXPECT_EQ(streamed, old_style);
  // The streamed body parses whole with protobuf.
  summa::v1::Checkpoint whole;
  ASSERT_TRUE(whole.ParseFromString(streamed.substr(16, streamed.size() - 20)));
  EXPECT_EQ(whole.SerializeAsString(), body);
  EXPECT_EQ(whole.partitions_size(), 6);
  // A file written whole loads through the reader.
  const std::string old_path = (dir_ / "ckpt-000000000011.summa").string();
  PutFile(old_path, old_style);
  auto read = Read(old_path, 5);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), body);
  auto decoded = DecodeCheckpoint(*read, ManyPartitions().job);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSamePartitions(*decoded, ManyPartitions());
}

// A field a later release adds after the partitions is skipped; a header field there is refused.
TEST_F(CheckpointTest, FieldsAfterThePartitions) {
  const summa::v1::Checkpoint c = EncodeCheckpoint(ManyPartitions());
  std::string body = c.SerializeAsString();
  std::string later;
  {
    google::protobuf::io::StringOutputStream stream(&later);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag((99 << 3) | 2);
    out.WriteVarint32(3);
    out.WriteString("new");
  }
  const std::string path = (dir_ / "ckpt-000000000010.summa").string();
  std::filesystem::create_directories(dir_);
  PutFile(path, FileAround(body + later));
  auto read = Read(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->partitions_size(), 6);
  summa::v1::Checkpoint version_last;
  version_last.set_version(3);
  PutFile(path, FileAround(body + version_last.SerializeAsString()));
  EXPECT_EQ(Read(path).status().code(), absl::StatusCode::kDataLoss);
}

// Cut anywhere (inside the header, inside a partition's record, inside the CRC), a file is
// DATA_LOSS; so is a body cut inside a record even when its length and CRC were made to agree,
// and a body that lost its last partition is refused by the decoding.
TEST_F(CheckpointTest, TornFilesAreDataLossWhereverTheyAreCut) {
  const ServerSnapshot s = ManyPartitions();
  const summa::v1::Checkpoint c = EncodeCheckpoint(s);
  auto path = Write(dir_, c);
  ASSERT_TRUE(path.ok());
  const std::string file = FileBytes(*path);
  const std::string body = file.substr(16, file.size() - 20);
  summa::v1::Checkpoint header = c;
  header.clear_partitions();
  const size_t header_end = header.ByteSizeLong();
  const size_t record = c.partitions(0).ByteSizeLong() + 2;  // tag, one-byte length
  ASSERT_LT(record, 128u);
  const std::string torn = (dir_ / "ckpt-000000000099.summa").string();
  for (size_t cut : {size_t{0}, size_t{7}, size_t{16}, size_t{17}, 16 + header_end / 2, 16 + header_end,
                     16 + header_end + 1, 16 + header_end + record + record / 2, file.size() - 5,
                     file.size() - 1}) {
    SCOPED_TRACE(cut);
    PutFile(torn, file.substr(0, cut));
    EXPECT_EQ(Read(torn).status().code(), absl::StatusCode::kDataLoss) << Read(torn).status();
  }
  const size_t in_optimizer = body.find("adam(lr=0.001)") + 3;
  ASSERT_LT(in_optimizer, header_end);
  for (size_t cut : {in_optimizer, header_end + 1, header_end + record + record / 2, body.size() - 1}) {
    SCOPED_TRACE(cut);
    PutFile(torn, FileAround(body.substr(0, cut)));
    auto read = Read(torn, 4);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_NE(read.status().message().find("cannot parse"), absl::string_view::npos) << read.status();
  }
  const size_t last = c.partitions(5).ByteSizeLong() + 2;
  PutFile(torn, FileAround(body.substr(0, body.size() - last)));
  auto read = Read(torn);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->partitions_size(), 5);
  auto short_one = DecodeCheckpoint(*read, s.job);
  EXPECT_EQ(short_one.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(short_one.status().message().find("holds 5 partitions; its model has 6"), absl::string_view::npos)
      << short_one.status();
}

// Every single byte flipped, in the prefix, the header, any partition or the CRC: DATA_LOSS, and
// past the prefix the message names the checksum, whatever the byte broke first.
TEST_F(CheckpointTest, AFlippedByteAnywhereIsDataLoss) {
  auto path = Write(dir_, EncodeCheckpoint(ManyPartitions()));
  ASSERT_TRUE(path.ok());
  const std::string file = FileBytes(*path);
  const std::string flipped = (dir_ / "ckpt-000000000099.summa").string();
  google::protobuf::LogSilencer quiet;  // a flipped name is invalid UTF-8, which protobuf logs
  for (size_t i = 0; i < file.size(); ++i) {
    std::string bytes = file;
    bytes[i] ^= 0x10;
    PutFile(flipped, bytes);
    auto read = Read(flipped, 16);
    ASSERT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << "byte " << i << ": " << read.status();
    if (i >= 16) {
      ASSERT_NE(read.status().message().find("checksum mismatch"), absl::string_view::npos)
          << "byte " << i << ": " << read.status();
    }
  }
}

// A body over 2 GiB (more than protobuf parses as one message, or counts through one stream)
// reads a partition at a time. The weights are holes in a sparse file, so this costs a read
// of zeros from the page cache, not the disk.
TEST_F(CheckpointTest, ABodyOverTwoGiBReadsPartitionByPartition) {
  constexpr int kPartitions = 33;
  constexpr uint64_t kWeightBytes = uint64_t{64} << 20;  // 33 x 64 MiB: just over 2 GiB
  std::filesystem::create_directories(dir_);
  const std::string path = (dir_ / "ckpt-000000000001.summa").string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  std::string prefix("SUMMACK1");
  AppendLe(prefix, 0, 8);  // the length, set below
  summa::v1::Checkpoint header;
  header.set_version(1);
  header.set_world_size(2);
  std::string encoded = header.SerializeAsString();
  uint64_t offset = 16 + encoded.size();
  uLong body_crc = crc32(0L, reinterpret_cast<const Bytef*>(encoded.data()), encoded.size());
  ASSERT_EQ(::pwrite(fd, encoded.data(), encoded.size(), 16), static_cast<ssize_t>(encoded.size()));
  const std::vector<char> zeros(1 << 20, 0);
  const uLong zeros_crc = crc32(0L, reinterpret_cast<const Bytef*>(zeros.data()), zeros.size());
  for (int id = 0; id < kPartitions; ++id) {
    // The record up to its weights' bytes: partition tag and length, id, weights' tag and length.
    std::string head;
    {
      google::protobuf::io::StringOutputStream stream(&head);
      google::protobuf::io::CodedOutputStream out(&stream);
      std::string fields;
      {
        google::protobuf::io::StringOutputStream field_stream(&fields);
        google::protobuf::io::CodedOutputStream f(&field_stream);
        f.WriteTag((1 << 3) | 0);
        f.WriteVarint32(id);
        f.WriteTag((3 << 3) | 2);
        f.WriteVarint64(kWeightBytes);
      }
      out.WriteTag((13 << 3) | 2);
      out.WriteVarint64(fields.size() + kWeightBytes);
      out.WriteString(fields);
    }
    ASSERT_EQ(::pwrite(fd, head.data(), head.size(), offset), static_cast<ssize_t>(head.size()));
    body_crc = crc32(body_crc, reinterpret_cast<const Bytef*>(head.data()), head.size());
    for (uint64_t done = 0; done < kWeightBytes; done += zeros.size()) {
      body_crc = crc32_combine(body_crc, zeros_crc, zeros.size());
    }
    offset += head.size() + kWeightBytes;
  }
  const uint64_t length = offset - 16;
  ASSERT_GT(length, static_cast<uint64_t>(INT_MAX));
  prefix = "SUMMACK1";
  AppendLe(prefix, length, 8);
  std::string trailer;
  AppendLe(trailer, crc32_combine(crc32(0L, reinterpret_cast<const Bytef*>(prefix.data()), 16), body_crc, length), 4);
  ASSERT_EQ(::pwrite(fd, prefix.data(), 16, 0), 16);
  ASSERT_EQ(::pwrite(fd, trailer.data(), 4, offset), 4);
  ::close(fd);

  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().world_size(), 2);
  summa::v1::PartitionCheckpoint p;
  int read = 0;
  while (true) {
    auto more = (*reader)->Next(&p);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    ASSERT_EQ(p.id(), static_cast<uint32_t>(read));
    ASSERT_EQ(p.weights().size(), kWeightBytes);
    ++read;
  }
  EXPECT_EQ(read, kPartitions);
}

}  // namespace
}  // namespace summa::server
