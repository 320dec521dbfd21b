#include "common/rpc/data_method.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "summa/v1/summa.grpc.pb.h"

namespace summa {
namespace {

const std::string& ServicePrefix() {
  static const std::string* const prefix =
      new std::string(absl::StrCat("/", summa::v1::ParameterServer::service_full_name(), "/"));
  return *prefix;
}

}  // namespace

absl::string_view DataMethodName(DataMethod method) {
  switch (method) {
    case DataMethod::kInitialize:
      return "Initialize";
    case DataMethod::kPush:
      return "Push";
    case DataMethod::kPull:
      return "Pull";
    case DataMethod::kPushPull:
      return "PushPull";
    case DataMethod::kAllReduce:
      return "AllReduce";
    case DataMethod::kSparsePull:
      return "SparsePull";
    case DataMethod::kSparsePush:
      return "SparsePush";
  }
  return "";
}

const char* DataMethodPath(DataMethod method) {
  static const std::string* const paths = [] {
    auto* p = new std::string[std::size(kDataMethods)];
    for (DataMethod m : kDataMethods) p[static_cast<uint32_t>(m) - 1] = ServicePrefix() + std::string(DataMethodName(m));
    return p;
  }();
  return paths[static_cast<uint32_t>(method) - 1].c_str();
}

std::optional<DataMethod> DataMethodOfNumber(uint32_t number) {
  for (DataMethod m : kDataMethods) {
    if (static_cast<uint32_t>(m) == number) return m;
  }
  return std::nullopt;
}

std::optional<DataMethod> DataMethodOf(absl::string_view grpc_path) {
  if (!absl::ConsumePrefix(&grpc_path, ServicePrefix())) return std::nullopt;
  for (DataMethod m : kDataMethods) {
    if (grpc_path == DataMethodName(m)) return m;
  }
  return std::nullopt;
}

}  // namespace summa
