#include "common/rpc/tokens.h"

#include <openssl/sha.h>

#include <array>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace summa {
namespace {

constexpr absl::Duration kRefresh = absl::Seconds(kTokenRefreshSeconds);

absl::StatusOr<std::string> ReadWhole(const std::string& path, absl::string_view what) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using Digest = std::array<uint8_t, SHA256_DIGEST_LENGTH>;

Digest DigestOf(absl::string_view token) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  return d;
}

}  // namespace

absl::StatusOr<std::vector<ListedToken>> ParseTokenList(absl::string_view text, absl::string_view flag,
                                                        absl::string_view path, bool scoped_ok) {
  std::vector<ListedToken> tokens;
  absl::flat_hash_map<std::string, int> line_of;  // each token's line, for a repeated one
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = absl::StrCat(flag, " ", path, " line ", number, ": ");
    // No message quotes a word of the line but what follows rank=: any other may be a token.
    const std::vector<absl::string_view> words = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() > 2) {
      return absl::InvalidArgumentError(absl::StrCat(where, words.size(), " words; a line is TOKEN or TOKEN rank=R"));
    }
    ListedToken listed;
    listed.token = std::string(words[0]);
    if (words.size() == 2) {
      absl::string_view rank = words[1];
      if (!absl::ConsumePrefix(&rank, "rank=")) {
        return absl::InvalidArgumentError(absl::StrCat(where, "after the token only rank=R may follow"));
      }
      if (!scoped_ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "an admin token speaks for the whole job: rank= scopes worker tokens (--token_file)"));
      }
      if (!absl::SimpleAtoi(rank, &listed.rank) || listed.rank < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "rank=", rank, " is not a rank (a whole number, 0 or more; a bare token speaks for any rank)"));
      }
    }
    const auto [first, added] = line_of.emplace(listed.token, number);
    if (!added) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the token of line ", first->second, " again: list each token once (a rank may have several)"));
    }
    tokens.push_back(std::move(listed));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " lists no token (blank lines and # comments only)"));
  }
  return tokens;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWhole(path, "token file");
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  if (token.find_first_of(" \t\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, " holds more than one word: a client's token file holds its token alone (the list "
        "with rank= is summa-server's --token_file)"));
  }
  return token;
}

absl::StatusOr<std::string> ReadUnscopedToken(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWhole(path, "--token_file");
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<ListedToken>> tokens = ParseTokenList(*text, "--token_file", path, /*scoped_ok=*/true);
  if (!tokens.ok()) return tokens.status();
  for (ListedToken& t : *tokens) {
    if (t.rank == kAnyRank) return std::move(t.token);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--token_file ", path, " lists no bare token: a shard calls shard 0 (--coordinator) for the whole job, "
      "which a token scoped to one rank (rank=) cannot do"));
}

// The server's tokens, by digest, as TokenCheck's copies share them.
struct TokenCheck::Tokens {
  struct Known {
    bool admin = false;
    int rank = kAnyRank;
    // When it was taken out of its file, plus the grace period: refused from then on.
    absl::Time retires = absl::InfiniteFuture();
  };
  using Map = absl::flat_hash_map<Digest, Known>;

  // The tokens `worker_text` and `admin_text` (the files' contents; empty for a file not given)
  // list; INVALID_ARGUMENT naming the file and line, or when the two files share a token.
  absl::StatusOr<Map> Parse(const std::string& worker_text, const std::string& admin_text) const {
    Map parsed;
    if (!files.worker.empty()) {
      absl::StatusOr<std::vector<ListedToken>> workers =
          ParseTokenList(worker_text, "--token_file", files.worker, /*scoped_ok=*/true);
      if (!workers.ok()) return workers.status();
      for (const ListedToken& t : *workers) parsed[DigestOf(t.token)] = Known{false, t.rank};
    }
    if (!files.admin.empty()) {
      absl::StatusOr<std::vector<ListedToken>> admins =
          ParseTokenList(admin_text, "--admin_token_file", files.admin, /*scoped_ok=*/false);
      if (!admins.ok()) return admins.status();
      for (const ListedToken& t : *admins) {
        if (!parsed.emplace(DigestOf(t.token), Known{true, kAnyRank}).second) {
          return absl::InvalidArgumentError(
              "--token_file and --admin_token_file hold the same token: give operators a token of their own");
        }
      }
    }
    return parsed;
  }

  // Both files' contents: INVALID_ARGUMENT naming the one that cannot be read.
  absl::Status Read(std::string* worker_text, std::string* admin_text) const {
    for (auto [path, text, flag] : {std::make_tuple(&files.worker, worker_text, "--token_file"),
                                    std::make_tuple(&files.admin, admin_text, "--admin_token_file")}) {
      if (path->empty()) continue;
      absl::StatusOr<std::string> read = ReadWhole(*path, flag);
      if (!read.ok()) return read.status();
      *text = *std::move(read);
    }
    return absl::OkStatus();
  }

  TokenFiles files;  // no paths: fixed tokens, never reloaded
  const Clock* clock = Clock::Real();
  // Whether a worker (an admin) token is set at all: fixed at the start, as the flags are.
  bool worker_set = false;
  bool admin_set = false;

  mutable absl::Mutex mu;  // after refresh_mu
  Map known ABSL_GUARDED_BY(mu);

  absl::Mutex refresh_mu;  // one Refresh at a time
  absl::Time next_read ABSL_GUARDED_BY(refresh_mu);
  std::string worker_text ABSL_GUARDED_BY(refresh_mu);  // the files as last taken in
  std::string admin_text ABSL_GUARDED_BY(refresh_mu);
  std::string problem ABSL_GUARDED_BY(refresh_mu);  // why the last reload failed: warned of once
};

TokenCheck::TokenCheck(const std::string& worker_token, const std::string& admin_token, bool status_needs_token)
    : tokens_(std::make_shared<Tokens>()) {
  tokens_->files.status_needs_token = status_needs_token;
  tokens_->worker_set = !worker_token.empty();
  tokens_->admin_set = !admin_token.empty();
  absl::MutexLock lock(&tokens_->mu);
  if (!worker_token.empty()) tokens_->known[DigestOf(worker_token)] = Tokens::Known{false, kAnyRank};
  if (!admin_token.empty()) tokens_->known[DigestOf(admin_token)] = Tokens::Known{true, kAnyRank};
}

absl::StatusOr<TokenCheck> TokenCheck::Load(const TokenFiles& files, const Clock* clock) {
  TokenCheck check;
  check.tokens_ = std::make_shared<Tokens>();
  Tokens& t = *check.tokens_;
  t.files = files;
  t.clock = clock;
  t.worker_set = !files.worker.empty();
  t.admin_set = !files.admin.empty();
  absl::MutexLock refresh(&t.refresh_mu);
  if (absl::Status read = t.Read(&t.worker_text, &t.admin_text); !read.ok()) return read;
  absl::StatusOr<Tokens::Map> parsed = t.Parse(t.worker_text, t.admin_text);
  if (!parsed.ok()) return parsed.status();
  t.next_read = clock->Now() + kRefresh;
  absl::MutexLock lock(&t.mu);
  t.known = *std::move(parsed);
  return check;
}

bool TokenCheck::any() const { return tokens_ != nullptr && (tokens_->worker_set || tokens_->admin_set); }

absl::StatusOr<Caller> TokenCheck::Identify(const grpc::ServerContextBase& context, Role role) const {
  if (!any()) return Caller{};
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) return Identify(absl::string_view(), role);
  return Identify(absl::string_view(found->second.data(), found->second.size()), role);
}

absl::StatusOr<Caller> TokenCheck::Identify(absl::string_view authorization, Role role) const {
  if (!any()) return Caller{};
  const Tokens& t = *tokens_;
  if (role == Role::kStatus && !t.files.status_needs_token) return Caller{};
  // Worker calls (and a status behind a token) are open while no worker token is set.
  if (role != Role::kAdmin && !t.worker_set) return Caller{};
  absl::string_view sent = authorization;
  if (!absl::ConsumePrefix(&sent, "Bearer ")) {
    return absl::UnauthenticatedError(
        "this server needs a bearer token (\"authorization: Bearer <token>\"; summa-worker --token_file)");
  }
  const Digest digest = DigestOf(sent);
  std::optional<Tokens::Known> known;
  {
    absl::ReaderMutexLock lock(&t.mu);
    if (auto it = t.known.find(digest); it != t.known.end()) known = it->second;
  }
  // The clock is read only for a token taken out of its file.
  const bool retired = known.has_value() && known->retires != absl::InfiniteFuture() &&
                       t.clock->Now() >= known->retires;
  if (retired) known.reset();
  if (role == Role::kAdmin) {
    if (known.has_value() && known->admin) return Caller{};
    if (!t.admin_set) {
      return absl::PermissionDeniedError("admin calls are off: the server has no --admin_token_file");
    }
    if (known.has_value()) {
      return absl::PermissionDeniedError("an admin call needs the admin token (--admin_token_file), not a worker's");
    }
  } else if (known.has_value()) {
    return Caller{known->admin ? kAnyRank : known->rank};
  }
  if (retired) {
    return absl::UnauthenticatedError(
        "the token was taken out of the server's token files and its grace period (--token_grace_period) is over");
  }
  return absl::UnauthenticatedError("the token matches none of this server's");
}

void TokenCheck::Refresh() {
  if (tokens_ == nullptr || (tokens_->files.worker.empty() && tokens_->files.admin.empty())) return;
  Tokens& t = *tokens_;
  absl::MutexLock refresh(&t.refresh_mu);
  const absl::Time now = t.clock->Now();
  if (now < t.next_read) return;
  t.next_read = now + kRefresh;
  std::string worker_text, admin_text;
  absl::Status read = t.Read(&worker_text, &admin_text);
  if (read.ok() && worker_text == t.worker_text && admin_text == t.admin_text) {
    // Unchanged: only the retired tokens whose grace period is over go.
    absl::MutexLock lock(&t.mu);
    for (auto it = t.known.begin(); it != t.known.end();) {
      if (it->second.retires <= now) {
        t.known.erase(it++);
      } else {
        ++it;
      }
    }
    return;
  }
  absl::StatusOr<Tokens::Map> fresh = read.ok() ? t.Parse(worker_text, admin_text) : read;
  if (!fresh.ok()) {
    if (fresh.status().message() != t.problem) {
      t.problem = std::string(fresh.status().message());
      SUMMA_LOG(WARNING) << "token files not reloaded: " << t.problem << "; the tokens read before stay";
    }
    return;
  }
  t.problem.clear();
  int workers = 0, scoped = 0, admins = 0;
  for (const auto& [digest, k] : *fresh) {
    admins += k.admin;
    workers += !k.admin;
    scoped += k.rank != kAnyRank;
  }
  int taken_out = 0;
  {
    absl::MutexLock lock(&t.mu);
    for (const auto& [digest, old] : t.known) {
      if (fresh->contains(digest)) continue;  // still listed: its new line (a new rank, say) holds
      Tokens::Known k = old;
      if (k.retires == absl::InfiniteFuture()) {
        k.retires = now + t.files.grace;
        ++taken_out;
      }
      if (k.retires > now) fresh->emplace(digest, k);
    }
    t.known = *std::move(fresh);
  }
  t.worker_text = std::move(worker_text);
  t.admin_text = std::move(admin_text);
  auto tokens = [](int n) { return absl::StrCat(n, n == 1 ? " token" : " tokens"); };
  LogMessage log(LogSeverity::kInfo, __FILE__, __LINE__);
  log.stream() << "token files reloaded:";
  if (!t.files.worker.empty()) {
    log.stream() << " --token_file " << t.files.worker << ": " << tokens(workers) << " (" << scoped
                 << " scoped to a rank)" << (t.files.admin.empty() ? "" : ";");
  }
  if (!t.files.admin.empty()) log.stream() << " --admin_token_file " << t.files.admin << ": " << tokens(admins);
  if (taken_out > 0) {
    log.stream() << "; " << tokens(taken_out) << " taken out, "
                 << (t.files.grace > absl::ZeroDuration()
                         ? absl::StrCat("accepted until ", absl::FormatTime(absl::RFC3339_sec, now + t.files.grace, absl::UTCTimeZone()),
                                        " (--token_grace_period=",
                                        absl::FormatDuration(t.files.grace), ")")
                         : "refused from now (--token_grace_period=0)");
  }
}

struct ClientToken::File {
  std::string path;
  Reader read;
  const Clock* clock = nullptr;
  absl::Mutex mu;
  std::string token ABSL_GUARDED_BY(mu);
  absl::Time next_read ABSL_GUARDED_BY(mu);
  std::string problem ABSL_GUARDED_BY(mu);  // why the last read failed: warned of once
};

absl::StatusOr<ClientToken> ClientToken::FromFile(const std::string& path, Reader read, const Clock* clock) {
  absl::StatusOr<std::string> token = read(path);
  if (!token.ok()) return token.status();
  ClientToken client;
  client.file_ = std::make_shared<File>();
  File& f = *client.file_;
  f.path = path;
  f.read = std::move(read);
  f.clock = clock;
  absl::MutexLock lock(&f.mu);
  f.token = *std::move(token);
  f.next_read = clock->Now() + kRefresh;
  return client;
}

std::string ClientToken::Current() const {
  if (file_ == nullptr) return fixed_;
  File& f = *file_;
  absl::MutexLock lock(&f.mu);
  const absl::Time now = f.clock->Now();
  if (now >= f.next_read) {
    f.next_read = now + kRefresh;
    absl::StatusOr<std::string> token = f.read(f.path);
    if (!token.ok()) {
      if (token.status().message() != f.problem) {
        f.problem = std::string(token.status().message());
        SUMMA_LOG(WARNING) << f.problem << "; calls carry the token read before";
      }
    } else {
      f.problem.clear();
      if (*token != f.token) {
        f.token = *std::move(token);
        SUMMA_LOG(INFO) << "token file " << f.path << " changed: calls carry its new token from now on";
      }
    }
  }
  return f.token;
}

void AttachToken(const std::string& token, grpc::ClientContext* context) {
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

}  // namespace summa
