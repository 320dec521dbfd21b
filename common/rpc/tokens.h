// Bearer tokens, on both sides of a call: the files that hold them, the server's check of a call's
// token (the role it holds and, for a worker token, the rank it may be scoped to), and the token a
// client sends. Both sides read their files again when they change, so tokens rotate without a
// restart.
//
// A server's --token_file lists worker tokens, one a line; blank lines and lines whose first
// non-blank character is # are skipped:
//
//   # any rank (the whole job): shard coordination, operators' pulls
//   7c0f...e1
//   # scoped: only rank 0's calls, only rank 1's
//   91ab...3d rank=0
//   d4e2...08 rank=1
//
// --admin_token_file lists admin tokens the same way, without rank=. A client's token file holds
// its one token (ReadTokenFile).
//
// Rotation: TokenCheck::Refresh reads the server's files again once kTokenRefreshSeconds have
// passed since it last did: a token new to a file is accepted from then on, one gone from it for
// the grace period more (--token_grace_period), then refused. A file that cannot be read, is empty
// or does not parse keeps the tokens read last, and a warning says why. ClientToken reads a
// client's file again as often. No log line or error names a token's value.
#ifndef SUMMA_COMMON_RPC_TOKENS_H_
#define SUMMA_COMMON_RPC_TOKENS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace summa {

// How often token files are read again: as often as certificates (transport.h's
// kCertificateRefreshSeconds, which must agree).
inline constexpr unsigned kTokenRefreshSeconds = 5;

// A worker token's rank when it is scoped to none: it speaks for the whole job.
inline constexpr int kAnyRank = -1;

// One token of a server's token file, and the rank it is scoped to.
struct ListedToken {
  std::string token;
  int rank = kAnyRank;
};

// The tokens of a server's token file (`text`), in file order. `flag` and `path` name the file in
// errors ("--token_file /run/tokens line 3: ..."); `scoped_ok`: whether rank=R may follow a token
// (worker tokens; an admin token is never scoped). INVALID_ARGUMENT for a line that is not TOKEN or
// TOKEN rank=R (R a whole number, 0 or more), a token listed twice, or no token at all.
absl::StatusOr<std::vector<ListedToken>> ParseTokenList(absl::string_view text, absl::string_view flag,
                                                        absl::string_view path, bool scoped_ok);

// A client's token file: its one token, without surrounding whitespace. INVALID_ARGUMENT when it
// cannot be read, is empty, or holds more than one word (a server's list, say).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The first token of a server's --token_file scoped to no rank: what a shard calls shard 0 with
// (it speaks for the whole job). INVALID_ARGUMENT naming the file when it has none.
absl::StatusOr<std::string> ReadUnscopedToken(const std::string& path);

enum class Role { kStatus, kWorker, kAdmin };

// Who a call's token says its caller is.
struct Caller {
  // A rank-scoped worker token's rank; kAnyRank for an unscoped or admin token, and for every
  // call of a server that asks for no token.
  int rank = kAnyRank;
  bool scoped() const { return rank != kAnyRank; }
};

// Where a server's tokens come from (summa-server's flags).
struct TokenFiles {
  std::string worker;  // --token_file; empty: members' calls are open
  std::string admin;   // --admin_token_file; empty: admin calls are refused once any token is set
  // How long a token taken out of its file is still accepted (--token_grace_period).
  absl::Duration grace = absl::Minutes(5);
  bool status_needs_token = false;  // --status_needs_token
};

// The server's side: whether a call's token holds the role its method needs, and as whom it
// speaks. Roles: a worker token admits the members' calls; the admin token those and the admin
// calls; GetStatus, health and reflection are open unless status_needs_token. Members' calls are
// open while no worker token is set; once any token is, an admin call needs the admin token
// (refused outright when there is none). Copies share one set of tokens, which Refresh reloads.
// Thread-safe. A presented token is looked up by its SHA-256 digest (the server keeps only
// digests): one hash a call whatever the number of tokens, in time that tells nothing of theirs.
class TokenCheck {
 public:
  TokenCheck() = default;  // everything open
  // Fixed tokens, unscoped, never reloaded (tests); an empty one is none.
  TokenCheck(const std::string& worker_token, const std::string& admin_token, bool status_needs_token);
  // The tokens of `files`, read now: INVALID_ARGUMENT naming the file (and line) when one cannot
  // be read or parsed, or when both files list one token. `clock` (not owned; outlives every copy)
  // times the refreshes and the grace periods.
  static absl::StatusOr<TokenCheck> Load(const TokenFiles& files, const Clock* clock = Clock::Real());

  // The caller, or UNAUTHENTICATED (no token, one that matches none, or one whose grace period
  // is over) or PERMISSION_DENIED (a worker token on an admin call), naming the flag that sets
  // the token. Whether the caller may act as the rank its request names is the method's to say
  // (server/rpc/method_roles.h).
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context, Role role) const;
  // The same for a call whose "authorization" value (empty when it sent none) came another way
  // (the socket data plane's hello, common/rpc/socket_frame.h).
  absl::StatusOr<Caller> Identify(absl::string_view authorization, Role role) const;
  absl::Status Check(const grpc::ServerContextBase& context, Role role) const {
    return Identify(context, role).status();
  }
  absl::Status Check(absl::string_view authorization, Role role) const {
    return Identify(authorization, role).status();
  }

  // Reads the files again when kTokenRefreshSeconds have passed (by the clock) since they were
  // last read, and takes in what changed (the class comment says how). Cheap otherwise: the
  // daemon's ticker calls it every tick.
  void Refresh();

  bool any() const;

 private:
  struct Tokens;
  std::shared_ptr<Tokens> tokens_;  // null: everything open
};

// The token a client sends (empty: none): a fixed one, or its file's, read again once
// kTokenRefreshSeconds have passed since the last read, so that a rotated secret goes out from
// then on. A read that fails keeps the token read last (a warning says why, once). Copies share
// the file's state. Thread-safe.
class ClientToken {
 public:
  ClientToken() = default;
  // A fixed token: a std::string converts (ClientSecurity{tls, token}).
  ClientToken(std::string token) : fixed_(std::move(token)) {}  // NOLINT(google-explicit-constructor)
  ClientToken(const char* token) : fixed_(token) {}             // NOLINT(google-explicit-constructor)

  using Reader = std::function<absl::StatusOr<std::string>(const std::string& path)>;
  // `read(path)` now (its error when it fails), and again as the class comment says. `clock` (not
  // owned) outlives every copy.
  static absl::StatusOr<ClientToken> FromFile(const std::string& path, Reader read = ReadTokenFile,
                                              const Clock* clock = Clock::Real());

  // The token to send now.
  std::string Current() const;

 private:
  struct File;
  std::string fixed_;
  std::shared_ptr<File> file_;  // null: fixed_
};

// Adds "authorization: Bearer <token>" to a call (nothing when `token` is empty).
void AttachToken(const std::string& token, grpc::ClientContext* context);

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_TOKENS_H_
