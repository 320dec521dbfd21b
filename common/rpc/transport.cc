#include "common/rpc/transport.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <fstream>

#include "absl/strings/match.h"
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

}  // namespace summa
