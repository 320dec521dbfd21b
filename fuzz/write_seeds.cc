// Writes the seeds in fuzz/corpus/ that Summa's own writers make: summa-fuzz-seeds <corpus dir>.
//  - checkpoint_fuzzer: a checkpoint of each of its jobs (fuzz/checkpoint_jobs.h) after a step,
//    written by ParameterServer::MaybeCheckpoint, as a whole file and as the message the harness
//    frames;
//  - idx_fuzzer: a plain and a gzipped set of 3 images of 4 x 4 pixels with their labels;
//  - wire_fuzzer: every request the server parses (PushRequest, InitializeRequest, PullRequest,
//    AllReduceRequest) encoded by protobuf, whole and cut into slices.
// Each seed is laid out for its harness's FuzzedDataProvider: bytes and strings are read from the
// front, integers and choices from the back.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "fuzz/checkpoint_jobs.h"
#include "server/checkpoint/checkpoint_file.h"
#include "server/core/checkpoint_codec.h"
#include "server/core/parameter_server.h"
#include "summa/v1/summa.pb.h"

namespace summa {
namespace {

namespace fs = std::filesystem;
namespace pb = ::summa::v1;

// The checkpoint file at `path` as one message: its header with every partition.
absl::StatusOr<pb::Checkpoint> ReadWholeCheckpoint(const std::string& path) {
  absl::StatusOr<std::unique_ptr<summa::server::CheckpointReader>> reader = summa::server::CheckpointReader::Open(path);
  if (!reader.ok()) return reader.status();
  pb::Checkpoint whole = (*reader)->header();
  for (;;) {
    pb::PartitionCheckpoint partition;
    absl::StatusOr<bool> more = (*reader)->Next(&partition);
    if (!more.ok()) return more.status();
    if (!*more) return whole;
    *whole.add_partitions() = std::move(partition);
  }
}

void Die(const std::string& what) {
  std::cerr << "summa-fuzz-seeds: " << what << "\n";
  std::exit(1);
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) Die("cannot write " + path.string());
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A FuzzedDataProvider input: `front` (what ConsumeBytes and the strings read, in order) and
// then the integers, which it reads from the last byte backwards (`back` in the order read).
std::string Provided(const std::string& front, const std::string& back) {
  return front + std::string(back.rbegin(), back.rend());
}

void Checkpoints(const fs::path& corpus) {
  using namespace summa::server;
  for (int job = 0; job < kCheckpointFuzzJobs; ++job) {
    const fs::path dir = fs::temp_directory_path() / ("summa-fuzz-seeds-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    ServerOptions o = CheckpointFuzzJob(job);
    o.checkpoint_dir = dir.string();
    const int world_size = o.world_size;
    ParameterServer server(std::move(o));
    const std::string w = Bytes({1, 2, 3, 4}), b = Bytes({10, 20});
    for (int rank = 0; rank < world_size; ++rank) {
      JoinRequestView join;
      join.rank = rank;
      join.world_size = world_size;
      join.params = {{{"w", DType::kFloat32, {2, 2}}, rank == 0 ? absl::string_view(w) : ""},
                     {{"b", DType::kFloat32, {2}}, rank == 0 ? absl::string_view(b) : ""}};
      absl::StatusOr<JoinResult> joined = server.Join(join);
      if (!joined.ok()) Die(joined.status().ToString());
      for (const PartitionRange& p : joined->partitions) {
        const std::string grad = Bytes(std::vector<float>(p.length, 0.5f * (rank + 1)));
        PushRequestView push;
        push.rank = rank;
        push.step = 0;
        push.partition = p.id;
        push.num_examples = 4;
        push.data = grad;
        if (absl::StatusOr<bool> pushed = server.Push(push); !pushed.ok()) Die(pushed.status().ToString());
      }
    }
    if (absl::Status s = server.MaybeCheckpoint(/*force=*/true); !s.ok()) Die(s.ToString());
    const std::string path = server.Status().checkpoint.path;
    const std::string file = ReadFile(path);
    absl::StatusOr<pb::Checkpoint> read = ReadWholeCheckpoint(path);
    if (!read.ok()) Die(read.status().ToString());
    const std::string name = "job" + std::to_string(job);
    WriteFile(corpus / "checkpoint_fuzzer" / (name + "-file"), std::string(1, char(job << 1)) + file);
    WriteFile(corpus / "checkpoint_fuzzer" / (name + "-message"),
              std::string(1, char(job << 1 | 1)) + read->SerializeAsString());
    fs::remove_all(dir);
  }
}

std::string IdxHeader(int dims, std::initializer_list<uint32_t> sizes) {
  std::string h = {0, 0, 8, static_cast<char>(dims)};
  for (uint32_t s : sizes) {
    for (int shift : {24, 16, 8, 0}) h += static_cast<char>(s >> shift);
  }
  return h;
}

std::string Gzipped(const std::string& bytes) {
  const fs::path path = fs::temp_directory_path() / ("summa-fuzz-seeds-" + std::to_string(::getpid()) + ".gz");
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), bytes.size());
  gzclose(f);
  std::string out = ReadFile(path);
  fs::remove(path);
  return out;
}

// ConsumeRandomLengthString's form: every backslash doubled, then a backslash and another
// character to end the string.
std::string Escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\\') out += c;
  }
  return out + "\\.";
}

void IdxFiles(const fs::path& corpus) {
  std::string pixels(3 * 16, 0);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i * 5);
  const std::string images = IdxHeader(3, {3, 4, 4}) + pixels;
  const std::string labels = IdxHeader(1, {3}) + std::string("\x07\x00\x09", 3);
  const std::string three(1, '\x01');  // ConsumeBool: the images file has 3 dimensions
  WriteFile(corpus / "idx_fuzzer" / "plain", Provided(Escaped(images) + labels, three));
  WriteFile(corpus / "idx_fuzzer" / "gzipped", Provided(Escaped(Gzipped(images)) + Gzipped(labels), three));
}

// The request, its kind for wire_fuzzer and where to cut it.
void Request(const fs::path& corpus, const std::string& name, int kind, const std::string& message,
             std::vector<uint16_t> cuts) {
  std::string back(1, static_cast<char>(kind));
  back += static_cast<char>(cuts.size());
  for (uint16_t cut : cuts) {
    back += static_cast<char>(cut >> 8);
    back += static_cast<char>(cut & 0xff);
  }
  WriteFile(corpus / "wire_fuzzer" / name, Provided(message, back));
}

void Requests(const fs::path& corpus) {
  const std::string values = Bytes({1.5f, -2, 3, 4e20f});
  pb::PushRequest push;
  push.set_rank(1);
  push.set_step(7);
  push.set_partition(2);
  push.set_num_examples(128);
  push.set_dtype(pb::DTYPE_FLOAT32);
  push.set_data(values);
  Request(corpus, "push", 0, push.SerializeAsString(), {});
  Request(corpus, "push-cut", 0, push.SerializeAsString(), {3, 13});
  pb::InitializeRequest init;
  init.set_rank(0);
  init.set_partition(3);
  init.set_dtype(pb::DTYPE_FLOAT32);
  init.set_data(values);
  Request(corpus, "initialize", 1, init.SerializeAsString(), {});
  pb::PullRequest pull;
  pull.set_rank(1);
  pull.set_partition(2);
  pull.set_min_version(8);
  Request(corpus, "pull", 2, pull.SerializeAsString(), {});
  pb::AllReduceRequest all_reduce;
  all_reduce.set_name("loss");
  all_reduce.set_group_size(2);
  all_reduce.set_rank(1);
  all_reduce.set_members(true);
  all_reduce.set_round(3);
  all_reduce.mutable_tensor()->set_name("t");
  all_reduce.mutable_tensor()->set_dtype(pb::DTYPE_FLOAT32);
  all_reduce.mutable_tensor()->add_shape(2);
  all_reduce.mutable_tensor()->add_shape(2);
  all_reduce.mutable_tensor()->set_data(values);
  Request(corpus, "all_reduce", 3, all_reduce.SerializeAsString(), {});
  Request(corpus, "all_reduce-cut", 3, all_reduce.SerializeAsString(), {1, 9, 20});
}

}  // namespace
}  // namespace summa

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: summa-fuzz-seeds <corpus dir (fuzz/corpus)>\n";
    return 2;
  }
  summa::SetMinLogSeverity(summa::LogSeverity::kError);
  const std::filesystem::path corpus = argv[1];
  summa::Checkpoints(corpus);
  summa::IdxFiles(corpus);
  summa::Requests(corpus);
  return 0;
}
