#include "common/rpc/transport.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace summa {
namespace {

absl::Status Readable(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read"));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTls(const TlsFiles& f, bool server) {
  if (!f.enabled()) return absl::OkStatus();
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together (a certificate and its key)");
  }
  if (server && f.cert.empty()) {
    return absl::InvalidArgumentError("a TLS server needs --tls_cert and --tls_key (--tls_ca alone asks for "
                                      "client certificates but gives the server none)");
  }
  if (!server && f.ca.empty()) {
    return absl::InvalidArgumentError("a TLS client needs --tls_ca: the CA that signed the server's certificate");
  }
  if (!f.cert.empty()) {
    if (absl::Status s = Readable(f.cert, "--tls_cert"); !s.ok()) return s;
    if (absl::Status s = Readable(f.key, "--tls_key"); !s.ok()) return s;
  }
  if (!f.ca.empty()) {
    if (absl::Status s = Readable(f.ca, "--tls_ca"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TlsFiles& f) {
  if (!f.enabled()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      f.key, f.cert, f.ca, kCertificateRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!f.ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsFiles& f) {
  if (!f.enabled()) return grpc::InsecureChannelCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      f.key, f.cert, f.ca, kCertificateRefreshSeconds);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!f.cert.empty()) options.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(options);
}

absl::Status CheckMetricsAddress(const std::string& address, const TlsFiles& tls) {
  if (!tls.enabled() || address.empty()) return absl::OkStatus();
  for (absl::string_view loopback : {"127.0.0.1:", "localhost:", "[::1]:"}) {
    if (absl::StartsWith(address, loopback)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--metrics_address ", address, ": /metrics is plain HTTP, so with TLS on it must listen on "
      "loopback (127.0.0.1:PORT); scrape it from the same host or pod"));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": cannot read"));
  std::stringstream s;
  s << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(s.str()));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status TokenCheck::Check(const grpc::ServerContextBase& context, Role role) const {
  if (!any()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) return Check(absl::string_view(), role);
  return Check(absl::string_view(found->second.data(), found->second.size()), role);
}

absl::Status TokenCheck::Check(absl::string_view authorization, Role role) const {
  if (!any()) return absl::OkStatus();
  if (role == Role::kStatus && !status_needs_token_) return absl::OkStatus();
  // Worker calls (and a status behind a token) are open while no worker token is set.
  if (role != Role::kAdmin && worker_.empty()) return absl::OkStatus();
  absl::string_view sent = authorization;
  if (!absl::ConsumePrefix(&sent, "Bearer ")) {
    return absl::UnauthenticatedError(
        "this server needs a bearer token (\"authorization: Bearer <token>\"; summa-worker --token_file)");
  }
  const bool admin = !admin_.empty() && ConstantTimeEquals(sent, admin_);
  const bool worker = !worker_.empty() && ConstantTimeEquals(sent, worker_);
  if (role == Role::kAdmin) {
    if (admin) return absl::OkStatus();
    if (admin_.empty()) {
      return absl::PermissionDeniedError("admin calls are off: the server has no --admin_token_file");
    }
    if (worker) return absl::PermissionDeniedError("an admin call needs the admin token (--admin_token_file), not a worker's");
    return absl::UnauthenticatedError("the token matches none of this server's");
  }
  if (admin || worker) return absl::OkStatus();
  return absl::UnauthenticatedError("the token matches none of this server's");
}

void AttachToken(const std::string& token, grpc::ClientContext* context) {
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

}  // namespace summa
