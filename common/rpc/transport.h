// Security at the gRPC edge, the same for every endpoint Summa serves or calls: TLS, mutual TLS
// when a server is given a CA, certificates reloaded when their files change (gRPC's file
// watcher), and bearer tokens (common/rpc/tokens.h: read from files and read again when they
// change, worker tokens optionally scoped to one rank). The core never sees any of it.
//
// Roles: a worker token admits the members' calls (Join, Heartbeat, Leave, Initialize, Push,
// Pull, PushPull, AllReduce); the admin token admits those and the admin calls (Checkpoint);
// GetStatus, health and reflection are open unless status_needs_token. Members' calls are open
// while no worker token is set; once any token is, an admin call needs the admin token (refused
// outright when there is none). A worker token scoped to rank R acts only as R: the server's
// table of methods (server/rpc/method_roles.h) says which rank each call acts as.
#ifndef SUMMA_COMMON_RPC_TRANSPORT_H_
#define SUMMA_COMMON_RPC_TRANSPORT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/rpc/tokens.h"

namespace summa {

// PEM files; all empty: plaintext.
struct TlsFiles {
  std::string cert;  // this endpoint's certificate chain
  std::string key;   // its private key
  std::string ca;    // server: client certificates must chain to it (mTLS); client: trusts it
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// How often the certificate files are read again (a rotated certificate is used from then on).
inline constexpr unsigned kCertificateRefreshSeconds = 5;
static_assert(kTokenRefreshSeconds == kCertificateRefreshSeconds, "tokens and certificates rotate alike");

// INVALID_ARGUMENT naming the flag: a certificate without its key or the other way round, a
// server CA without a server certificate, a client with TLS but no CA to trust, a file that
// cannot be read.
absl::Status ValidateTls(const TlsFiles& files, bool server);

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TlsFiles& files);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsFiles& files);

// /metrics is plain HTTP: with TLS on, INVALID_ARGUMENT unless `address` is a loopback one (the
// metrics are then scraped from the same host or pod).
absl::Status CheckMetricsAddress(const std::string& address, const TlsFiles& tls);

// What an endpoint serves with: its TLS files and the tokens its calls need.
struct EndpointSecurity {
  TlsFiles tls;
  TokenCheck tokens;
};

// What a client calls with: the TLS files (the CA it trusts; its own certificate for mTLS) and
// the token it sends (fixed, or its file's, read again when it changes).
struct ClientSecurity {
  TlsFiles tls;
  ClientToken token;
};

}  // namespace summa

#endif  // SUMMA_COMMON_RPC_TRANSPORT_H_
