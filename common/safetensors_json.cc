#include "common/safetensors_json.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace summa {
namespace {

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// RFC 8259 JSON, strictly: no comments, no trailing commas, no leading zeros; a duplicate key in
// any object is an error (JSON leaves it undefined; safetensors forbids it).
class JsonParser {
 public:
  explicit JsonParser(absl::string_view s) : s_(s) {}

  absl::StatusOr<Json> ParseValue(int depth = 0) {
    if (depth > 32) return Fail("nested deeper than 32 levels");
    SkipSpace();
    if (pos_ >= s_.size()) return Fail("the header ends where a value should be");
    Json v;
    const char c = s_[pos_];
    if (c == '{') {
      v.kind = Json::kObject;
      ++pos_;
      SkipSpace();
      if (Peek('}')) return ++pos_, v;
      for (;;) {
        SkipSpace();
        if (!Peek('"')) return Fail("expected a string key");
        SUMMA_ASSIGN_OR_RETURN(std::string key, ParseString());
        for (const auto& member : v.members) {
          if (member.first == key) return Fail(absl::StrCat("duplicate key \"", key, "\""));
        }
        SkipSpace();
        if (!Peek(':')) return Fail("expected ':'");
        ++pos_;
        SUMMA_ASSIGN_OR_RETURN(Json value, ParseValue(depth + 1));
        v.members.emplace_back(std::move(key), std::move(value));
        SkipSpace();
        if (Peek(',')) {
          ++pos_;
          continue;
        }
        if (Peek('}')) return ++pos_, v;
        return Fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Json::kArray;
      ++pos_;
      SkipSpace();
      if (Peek(']')) return ++pos_, v;
      for (;;) {
        SUMMA_ASSIGN_OR_RETURN(Json item, ParseValue(depth + 1));
        v.items.push_back(std::move(item));
        SkipSpace();
        if (Peek(',')) {
          ++pos_;
          continue;
        }
        if (Peek(']')) return ++pos_, v;
        return Fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Json::kString;
      SUMMA_ASSIGN_OR_RETURN(v.text, ParseString());
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber();
    for (const auto& [word, kind] : {std::pair<absl::string_view, Json::Kind>{"true", Json::kBool},
                                     {"false", Json::kBool}, {"null", Json::kNull}}) {
      if (s_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        v.kind = kind;
        v.text = std::string(word);
        return v;
      }
    }
    return Fail("unexpected character");
  }

  size_t pos() const { return pos_; }

 private:
  bool Peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  absl::Status Fail(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat("the header is not valid JSON at byte ", pos_, ": ", why));
  }

  absl::StatusOr<uint32_t> Hex4() {
    if (pos_ + 4 > s_.size()) return Fail("a \\u escape needs four hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else return Fail("a \\u escape needs four hex digits");
    }
    return v;
  }

  absl::StatusOr<std::string> ParseString() {
    ++pos_;  // the opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) return Fail("a string is not closed");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("a control character inside a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return Fail("a string is not closed");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          SUMMA_ASSIGN_OR_RETURN(uint32_t cp, Hex4());
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail("a lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") return Fail("a high surrogate without its low one");
            pos_ += 2;
            SUMMA_ASSIGN_OR_RETURN(uint32_t low, Hex4());
            if (low < 0xDC00 || low > 0xDFFF) return Fail("a high surrogate without its low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, &out);
          break;
        }
        default:
          return Fail(absl::StrCat("an unknown escape \\", std::string(1, e)));
      }
    }
  }

  absl::StatusOr<Json> ParseNumber() {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (Peek('-')) ++pos_;
    if (Peek('0')) {
      ++pos_;
    } else if (digits() == 0) {
      return Fail("a number needs digits");
    }
    if (Peek('.')) {
      ++pos_;
      if (digits() == 0) return Fail("a number needs digits after '.'");
    }
    if (Peek('e') || Peek('E')) {
      ++pos_;
      if (Peek('+') || Peek('-')) ++pos_;
      if (digits() == 0) return Fail("a number needs digits in its exponent");
    }
    Json v;
    v.kind = Json::kNumber;
    v.text = std::string(s_.substr(start, pos_ - start));
    return v;
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

const char* KindName(Json::Kind kind) {
  switch (kind) {
    case Json::kObject: return "an object";
    case Json::kArray: return "an array";
    case Json::kString: return "a string";
    case Json::kNumber: return "a number";
    case Json::kBool: return "a boolean";
    case Json::kNull: return "null";
  }
  return "?";
}

size_t FirstInvalidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int more;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      more = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      more = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      more = 3, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + more >= s.size()) return i;  // cut short
    for (int k = 1; k <= more; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[more] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += more + 1;
  }
  return absl::string_view::npos;
}

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      absl::StrAppend(out, "\\u00", std::string(1, kHex[c >> 4]), std::string(1, kHex[c & 0xF]));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

absl::StatusOr<Json> ParseJsonValue(absl::string_view s, size_t* end) {
  JsonParser parser(s);
  SUMMA_ASSIGN_OR_RETURN(Json value, parser.ParseValue());
  *end = parser.pos();
  return value;
}

}  // namespace summa
