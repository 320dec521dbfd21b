// Throwaway certificates for tests: scripts/make-certs.sh into a directory of the test's own.
#ifndef SUMMA_TESTS_TEST_CERTS_H_
#define SUMMA_TESTS_TEST_CERTS_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"

namespace summa::test {

// A CA, a server certificate (localhost, 127.0.0.1), a client certificate and two tokens in a
// directory of this test case's own (ctest runs the cases as processes of their own, at once);
// `name` tells apart the sets one case makes (two CAs, say).
inline std::string MakeCerts(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/certs_" +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                          std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  const std::string command = std::string(SUMMA_SOURCE_DIR) + "/scripts/make-certs.sh " + dir + " >/dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return dir;
}

// A file's text without surrounding whitespace (a token file's token).
inline std::string ReadTrimmed(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

}  // namespace summa::test

#endif  // SUMMA_TESTS_TEST_CERTS_H_
