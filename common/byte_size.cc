#include "common/byte_size.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace summa {
namespace {

struct Unit {
  const char* name;  // as printed
  int shift;
};
constexpr Unit kUnits[] = {{"GiB", 30}, {"MiB", 20}, {"KiB", 10}};

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  int64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(s.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size (e.g. 4096, 64K, 1MiB)"));
  }
  const std::string suffix = absl::AsciiStrToUpper(s.substr(digits));
  int shift = -1;
  if (suffix.empty() || suffix == "B") shift = 0;
  if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  if (shift < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': unknown unit '", s.substr(digits), "' (use K, M or G)"));
  }
  if (number > (int64_t{1} << (62 - shift))) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large"));
  }
  return number << shift;
}

std::string FormatByteSize(int64_t bytes) {
  for (const Unit& u : kUnits) {
    const int64_t unit = int64_t{1} << u.shift;
    if (bytes >= unit && bytes % unit == 0) return absl::StrCat(bytes / unit, u.name);
  }
  return absl::StrCat(bytes, "B");
}

}  // namespace summa
