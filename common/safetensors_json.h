// The strict JSON the safetensors header is written in (common/safetensors.h): a reader that keeps
// numbers as their text (offsets are u64, which a double would round past 2^53) and refuses
// duplicate keys, UTF-8 checks, and string escaping for the writer. Its messages speak of "the
// header". Free functions are thread-safe; a JsonParser is not.
#ifndef SUMMA_COMMON_SAFETENSORS_JSON_H_
#define SUMMA_COMMON_SAFETENSORS_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace summa {

// A JSON value as the header needs it. Numbers keep their text: offsets are u64, which a double
// would round past 2^53. Objects keep their members in order (duplicates are refused as parsed).
struct Json {
  enum Kind { kObject, kArray, kString, kNumber, kBool, kNull } kind = kNull;
  std::string text;  // a string's value, a number's digits
  std::vector<std::pair<std::string, Json>> members;
  std::vector<Json> items;
};

// "an object", "a number"...: a value's kind in a message.
const char* KindName(Json::Kind kind);

// The first byte of `s` that does not begin a well-formed UTF-8 sequence, or npos.
size_t FirstInvalidUtf8(absl::string_view s);

// `s` as a JSON string, quoted and escaped, appended to `out`.
void AppendJsonString(absl::string_view s, std::string* out);

// Parses one JSON value at the start of `s` (RFC 8259, strictly: no comments, no trailing commas,
// no leading zeros; a duplicate key in any object is an error). `*end`: the offset just past it.
absl::StatusOr<Json> ParseJsonValue(absl::string_view s, size_t* end);

}  // namespace summa

#endif  // SUMMA_COMMON_SAFETENSORS_JSON_H_
