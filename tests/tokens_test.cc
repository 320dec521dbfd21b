// common/rpc/tokens.h without a server: the token files' syntax and its refusals (each naming the
// file and line), who a token says its caller is (its role, the rank it is scoped to), and
// rotation on a FakeClock: a new token taken at the first refresh after kTokenRefreshSeconds, one
// taken out accepted for exactly its grace period, files that break keeping the last good tokens,
// and a client's token following its file.
#include "common/rpc/tokens.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace summa {
namespace {

// A file of this test's own (ctest runs each case as a process of its own, at once).
std::string PathOf(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/tokens_test_",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_", ::getpid(), "_", name);
}

std::string Write(const std::string& path, const std::string& text) {
  // Written aside and renamed in, as a rotated Kubernetes secret is.
  std::ofstream(path + ".new") << text;
  std::filesystem::rename(path + ".new", path);
  return path;
}

// Who `token` says its caller is on a call that needs `role` ("rank 0", "any rank"), or the code
// of its refusal ("UNAUTHENTICATED").
std::string Who(const TokenCheck& check, const std::string& token, Role role = Role::kWorker) {
  absl::StatusOr<Caller> caller = check.Identify("Bearer " + token, role);
  if (!caller.ok()) return absl::StatusCodeToString(caller.status().code());
  return caller->rank == kAnyRank ? "any rank" : absl::StrCat("rank ", caller->rank);
}

absl::Status ParseError(const std::string& text, bool scoped_ok = true) {
  return ParseTokenList(text, "--token_file", "/etc/t", scoped_ok).status();
}

TEST(TokenListTest, BareAndScopedTokensCommentsAndBlankLines) {
  absl::StatusOr<std::vector<ListedToken>> tokens =
      ParseTokenList("# the job's\n  bare-one  \n\n\tzero-token rank=0\r\n# rank 1\none-token   rank=1\n", "--token_file",
                     "/etc/t", /*scoped_ok=*/true);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[0].token, "bare-one");
  EXPECT_EQ((*tokens)[0].rank, kAnyRank);
  EXPECT_EQ((*tokens)[1].token, "zero-token");
  EXPECT_EQ((*tokens)[1].rank, 0);
  EXPECT_EQ((*tokens)[2].token, "one-token");
  EXPECT_EQ((*tokens)[2].rank, 1);
  // A one-line file of a token, as before scoped tokens: one bare token.
  tokens = ParseTokenList("s3cret\n", "--token_file", "/etc/t", true);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 1u);
  EXPECT_EQ((*tokens)[0].rank, kAnyRank);
}

TEST(TokenListTest, EachBadLineIsRefusedNamingTheFileAndLineButNoToken) {
  const struct {
    std::string text;
    std::string message;
  } cases[] = {
      {"a\nb rank=x\n", "--token_file /etc/t line 2: rank=x is not a rank (a whole number, 0 or more; a bare token "
                        "speaks for any rank)"},
      {"a rank=-1\n", "--token_file /etc/t line 1: rank=-1 is not a rank (a whole number, 0 or more; a bare token "
                      "speaks for any rank)"},
      {"a rank=\n", "--token_file /etc/t line 1: rank= is not a rank (a whole number, 0 or more; a bare token "
                    "speaks for any rank)"},
      {"a rank=0\n# b\nb\na rank=1\n",
       "--token_file /etc/t line 4: the token of line 1 again: list each token once (a rank may have several)"},
      {"a secret-b\n", "--token_file /etc/t line 1: after the token only rank=R may follow"},
      {"a rank=0 c\n", "--token_file /etc/t line 1: 3 words; a line is TOKEN or TOKEN rank=R"},
      {"# nothing\n\n", "--token_file /etc/t lists no token (blank lines and # comments only)"},
      {"", "--token_file /etc/t lists no token (blank lines and # comments only)"},
  };
  for (const auto& c : cases) {
    const absl::Status s = ParseError(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(s.message(), c.message) << c.text;
    EXPECT_EQ(s.message().find("secret"), absl::string_view::npos) << s.message();
  }
  const absl::Status admin = ParseTokenList("a rank=0\n", "--admin_token_file", "/etc/a", /*scoped_ok=*/false).status();
  EXPECT_EQ(admin.message(), "--admin_token_file /etc/a line 1: an admin token speaks for the whole job: rank= "
                             "scopes worker tokens (--token_file)");
}

TEST(TokenCheckTest, LoadRefusesABadFileNamingItAndTheLine) {
  const std::string workers = Write(PathOf("workers"), "good rank=0\nbad rank=one\n");
  absl::StatusOr<TokenCheck> loaded = TokenCheck::Load({workers, "", absl::Minutes(5), false});
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loaded.status().message(), absl::StrCat("--token_file ", workers, " line 2: rank=one is not a rank (a "
                                                    "whole number, 0 or more; a bare token speaks for any rank)"));
  loaded = TokenCheck::Load({PathOf("absent"), "", absl::Minutes(5), false});
  EXPECT_EQ(loaded.status().message(), absl::StrCat("--token_file ", PathOf("absent"), ": cannot read"));
  Write(workers, "w rank=0\nshared\n");
  const std::string admins = Write(PathOf("admins"), "shared\n");
  loaded = TokenCheck::Load({workers, admins, absl::Minutes(5), false});
  EXPECT_EQ(loaded.status().message(),
            "--token_file and --admin_token_file hold the same token: give operators a token of their own");
}

// Who each token says its caller is, for each role.
TEST(TokenCheckTest, ScopedBareAndAdminTokens) {
  const std::string workers = Write(PathOf("workers"), "bare\nzero rank=0\none rank=1\n");
  const std::string admins = Write(PathOf("admins"), "root\n");
  absl::StatusOr<TokenCheck> check = TokenCheck::Load({workers, admins, absl::Minutes(5), false});
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(Who(*check, "zero"), "rank 0");
  EXPECT_EQ(Who(*check, "one"), "rank 1");
  EXPECT_EQ(Who(*check, "bare"), "any rank");
  EXPECT_EQ(Who(*check, "root"), "any rank");  // the admin token acts for the whole job
  EXPECT_EQ(Who(*check, "root", Role::kAdmin), "any rank");
  EXPECT_EQ(Who(*check, "anyone", Role::kStatus), "any rank");  // GetStatus stays open
  const absl::Status scoped_admin = check->Identify("Bearer zero", Role::kAdmin).status();
  EXPECT_EQ(scoped_admin.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(scoped_admin.message(), "an admin call needs the admin token (--admin_token_file), not a worker's");
  const absl::Status unknown = check->Identify("Bearer zer0", Role::kWorker).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(unknown.message(), "the token matches none of this server's");
  EXPECT_EQ(check->Identify("zero", Role::kWorker).status().code(), absl::StatusCode::kUnauthenticated);  // no Bearer
}

// Rotation on a FakeClock: nothing changes before kTokenRefreshSeconds pass; then the new token
// is taken and the one taken out is accepted for exactly the grace period.
TEST(TokenCheckTest, ARotatedTokenIsTakenAndTheOldOneAcceptedForTheGracePeriod) {
  FakeClock clock;
  const std::string workers = Write(PathOf("workers"), "bare\nold-zero rank=0\n");
  absl::StatusOr<TokenCheck> check = TokenCheck::Load({workers, "", absl::Minutes(1), false}, &clock);
  ASSERT_TRUE(check.ok()) << check.status();
  Write(workers, "bare\nnew-zero rank=0\n");
  clock.Advance(absl::Seconds(kTokenRefreshSeconds) - absl::Nanoseconds(1));
  check->Refresh();  // before kTokenRefreshSeconds: the file is not read
  EXPECT_EQ(Who(*check, "new-zero"), "UNAUTHENTICATED");
  clock.Advance(absl::Nanoseconds(1));
  check->Refresh();
  EXPECT_EQ(Who(*check, "new-zero"), "rank 0");
  EXPECT_EQ(Who(*check, "old-zero"), "rank 0") << "within the grace period";
  clock.Advance(absl::Minutes(1) - absl::Nanoseconds(1));
  EXPECT_EQ(Who(*check, "old-zero"), "rank 0") << "a nanosecond before the grace period ends";
  clock.Advance(absl::Nanoseconds(1));
  const absl::Status over = check->Identify("Bearer old-zero", Role::kWorker).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(over.message(),
            "the token was taken out of the server's token files and its grace period (--token_grace_period) is over");
  EXPECT_EQ(Who(*check, "new-zero"), "rank 0");
  EXPECT_EQ(Who(*check, "bare"), "any rank");
  // The next refresh forgets it: then it is a token like any other unknown one.
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  check->Refresh();
  EXPECT_EQ(check->Identify("Bearer old-zero", Role::kWorker).status().message(),
            "the token matches none of this server's");
}

TEST(TokenCheckTest, WithNoGracePeriodATokenTakenOutIsRefusedAtTheReload) {
  FakeClock clock;
  const std::string workers = Write(PathOf("workers"), "a\nb rank=3\n");
  absl::StatusOr<TokenCheck> check = TokenCheck::Load({workers, "", absl::ZeroDuration(), false}, &clock);
  ASSERT_TRUE(check.ok()) << check.status();
  Write(workers, "a\nb rank=4\n# c and d are new\nc rank=3\nd\n");
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  check->Refresh();
  EXPECT_EQ(Who(*check, "b"), "rank 4") << "a token's new line holds at once";
  EXPECT_EQ(Who(*check, "c"), "rank 3");
  EXPECT_EQ(Who(*check, "d"), "any rank");
  Write(workers, "b rank=4\n");
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  check->Refresh();
  EXPECT_EQ(Who(*check, "a"), "UNAUTHENTICATED");
  EXPECT_EQ(Who(*check, "c"), "UNAUTHENTICATED");
  EXPECT_EQ(Who(*check, "b"), "rank 4");
}

// A token put back in its file within its grace period is a current one again, with no end.
TEST(TokenCheckTest, ATokenPutBackWithinItsGracePeriodStays) {
  FakeClock clock;
  const std::string workers = Write(PathOf("workers"), "a\nb\n");
  absl::StatusOr<TokenCheck> check = TokenCheck::Load({workers, "", absl::Minutes(1), false}, &clock);
  ASSERT_TRUE(check.ok()) << check.status();
  Write(workers, "a\n");
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  check->Refresh();
  Write(workers, "a\nb\n");
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  check->Refresh();
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(Who(*check, "b"), "any rank");
}

// A file that cannot be read, is empty or does not parse keeps the tokens read last; the admin
// file rotates as the workers' does.
TEST(TokenCheckTest, AFileThatBreaksKeepsTheLastGoodTokens) {
  FakeClock clock;
  const std::string workers = Write(PathOf("workers"), "w rank=0\n");
  const std::string admins = Write(PathOf("admins"), "root\n");
  absl::StatusOr<TokenCheck> check = TokenCheck::Load({workers, admins, absl::ZeroDuration(), false}, &clock);
  ASSERT_TRUE(check.ok()) << check.status();
  auto still_good = [&](const char* after) {
    clock.Advance(absl::Seconds(kTokenRefreshSeconds));
    check->Refresh();
    EXPECT_EQ(Who(*check, "w"), "rank 0") << after;
    EXPECT_EQ(Who(*check, "root", Role::kAdmin), "any rank") << after;
  };
  Write(workers, "\n# emptied\n");
  still_good("an empty file");
  Write(workers, "w rank=zero\n");
  still_good("a bad line");
  std::filesystem::remove(workers);
  still_good("a file gone");
  Write(workers, "w rank=0\nroot\n");
  still_good("a worker token the admin's");
  Write(workers, "w rank=0\n");
  Write(admins, "root2\n");
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  check->Refresh();
  EXPECT_EQ(Who(*check, "root2", Role::kAdmin), "any rank");
  EXPECT_EQ(Who(*check, "root", Role::kAdmin), "UNAUTHENTICATED");
}

TEST(ClientTokenTest, FollowsItsFileAndKeepsTheLastGoodToken) {
  FakeClock clock;
  const std::string path = Write(PathOf("token"), "first\n");
  absl::StatusOr<ClientToken> token = ClientToken::FromFile(path, ReadTokenFile, &clock);
  ASSERT_TRUE(token.ok()) << token.status();
  const ClientToken copy = *token;  // copies share the file's state
  EXPECT_EQ(token->Current(), "first");
  Write(path, "second\n");
  EXPECT_EQ(token->Current(), "first") << "read again only after kTokenRefreshSeconds";
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  EXPECT_EQ(copy.Current(), "second");
  EXPECT_EQ(token->Current(), "second");
  std::filesystem::remove(path);
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  EXPECT_EQ(token->Current(), "second");
  Write(path, "third\n");
  clock.Advance(absl::Seconds(kTokenRefreshSeconds));
  EXPECT_EQ(token->Current(), "third");
  EXPECT_EQ(ClientToken("fixed").Current(), "fixed");
  EXPECT_EQ(ClientToken().Current(), "");
}

TEST(TokenFileTest, AClientFileHoldsOneTokenAndAShardTakesTheFirstBareOne) {
  const std::string list = Write(PathOf("list"), "zero rank=0\n# the job's\nbare\nbare2\n");
  EXPECT_EQ(ReadTokenFile(list).status().message(),
            absl::StrCat("token file ", list, " holds more than one word: a client's token file holds its token "
                                              "alone (the list with rank= is summa-server's --token_file)"));
  absl::StatusOr<std::string> bare = ReadUnscopedToken(list);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(*bare, "bare");
  Write(list, "zero rank=0\none rank=1\n");
  EXPECT_EQ(ReadUnscopedToken(list).status().message(),
            absl::StrCat("--token_file ", list, " lists no bare token: a shard calls shard 0 (--coordinator) for "
                                                "the whole job, which a token scoped to one rank (rank=) cannot do"));
  const std::string empty = Write(PathOf("empty"), "  \n");
  EXPECT_EQ(ReadTokenFile(empty).status().message(), absl::StrCat("token file ", empty, " is empty"));
}

}  // namespace
}  // namespace summa
