// The socket data plane's framing through TLS (server/rpc/socket_plane.h with --tls_cert): each
// input is what a client sends once its TLS 1.3 handshake is done, its hello and frames, written
// through a real TLS connection on 127.0.0.1 to a plane over a core and an AllReduce hub wired
// as the daemon wires them (the wire codec behind it is wire_fuzzer's). The client then closes its
// sending side and reads to the end. The checks: nothing crashes (ASan, UBSan); the plane closes
// every connection once its client has (no input holds a connection or a thread); and after each
// input a well-formed hello on a fresh connection is still admitted.
//
// Input: the bytes sent inside the tunnel. Seeds (fuzz/corpus/plane_fuzzer/): a hello with the
// harness's token followed by frames of each data method.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/logging.h"
#include "common/rpc/socket_frame.h"
#include "common/rpc/socket_tls.h"
#include "server/core/all_reduce.h"
#include "server/core/parameter_server.h"
#include "server/rpc/service.h"
#include "server/rpc/socket_plane.h"

namespace summa::server {
namespace {

// The token the seeds' hellos carry.
constexpr char kToken[] = "plane-fuzzer-token";

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "plane_fuzzer: %s\n", what.c_str());
    std::abort();
  }
}

struct Plane {
  std::unique_ptr<ParameterServer> core;
  std::unique_ptr<AllReduceHub> hub;
  TokenCheck tokens{kToken, "", false};
  std::unique_ptr<ParameterServerService> service;
  std::unique_ptr<SocketPlane> plane;
  std::unique_ptr<socket_plane::TlsContext> client;
};

// The plane, stopped at exit (StopAtExit).
Plane* running = nullptr;

// Stops the plane and joins its threads before LeakSanitizer looks (its check runs after this
// handler, registered later): a connection thread still ending as the process exits holds its TLS
// session and OpenSSL's per-thread state, which LeakSanitizer reported as leaks of libcrypto's
// (seen in CI now and then: whether a thread was still ending was a matter of timing).
void StopAtExit() {
  if (running == nullptr) return;
  running->core->Shutdown();
  running->hub->Shutdown();
  running->plane->Stop();
}

Plane* Start() {
  // Certificates from the repository's script, into a directory of this process's own.
  char dir[] = "/tmp/summa-plane-fuzzer.XXXXXX";
  Check(::mkdtemp(dir) != nullptr, "mkdtemp");
  const std::string certs = dir;
  const std::string command = std::string("bash ") + SUMMA_SOURCE_DIR "/scripts/make-certs.sh " + certs + " >/dev/null";
  Check(std::system(command.c_str()) == 0, command);
  auto* p = new Plane;
  ServerOptions o;
  o.world_size = 2;
  o.barrier_deadline = absl::Seconds(2);
  p->core = std::make_unique<ParameterServer>(o);
  p->hub = std::make_unique<AllReduceHub>(o.barrier_deadline, o.clock, &p->core->membership(), o.limits);
  p->service = std::make_unique<ParameterServerService>(
      p->core.get(), p->hub.get(), [](std::function<void()> task) { task(); }, &p->tokens);
  SocketPlaneOptions options;
  options.tls = {certs + "/server.pem", certs + "/server.key", ""};
  absl::StatusOr<std::unique_ptr<SocketPlane>> plane =
      SocketPlane::Start("127.0.0.1:0", p->service.get(), &p->tokens, options);
  Check(plane.ok(), plane.status().ToString());
  p->plane = *std::move(plane);
  absl::StatusOr<std::unique_ptr<socket_plane::TlsContext>> client =
      socket_plane::TlsContext::Create({"", "", certs + "/ca.pem"}, /*server=*/false);
  Check(client.ok(), client.status().ToString());
  p->client = *std::move(client);
  running = p;
  std::atexit(StopAtExit);
  return p;
}

socket_plane::Link Open(Plane& p) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::StatusOr<socket_plane::OwnedFd> fd = socket_plane::Connect("127.0.0.1", p.plane->port(), deadline);
  Check(fd.ok(), fd.status().ToString());
  socket_plane::Link link(*std::move(fd));
  const absl::Status shaken = link.StartTls(*p.client, "127.0.0.1", deadline);
  Check(shaken.ok(), shaken.ToString());
  return link;
}

}  // namespace
}  // namespace summa::server

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  summa::SetMinLogSeverity(summa::LogSeverity::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace summa;
  using namespace summa::server;
  static Plane* plane = Start();
  {
    socket_plane::Link link = Open(*plane);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    iovec iov = {const_cast<uint8_t*>(data), size};
    // The plane may refuse and close before it has read everything: a failed write is an answer.
    link.WriteFull(&iov, 1, deadline, "the input").IgnoreError();
    ::shutdown(link.fd(), SHUT_WR);
    char sink[64 << 10];
    absl::Status read = absl::OkStatus();
    while (read.ok()) read = link.ReadFull(sink, sizeof(sink), deadline, "the plane's answers");
    Check(!absl::IsDeadlineExceeded(read), "the plane kept a connection open after its client closed: " + read.ToString());
  }
  // The plane still admits a client.
  socket_plane::Link link = Open(*plane);
  const std::string authorization = std::string("Bearer ") + kToken;
  char hello[socket_plane::kHelloBytes];
  socket_plane::EncodeHello(static_cast<uint32_t>(authorization.size()), hello);
  iovec iov[2] = {{hello, sizeof(hello)}, {const_cast<char*>(authorization.data()), authorization.size()}};
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  Check(link.WriteFull(iov, 2, deadline, "a hello").ok(), "a hello could not be sent");
  char head[socket_plane::kHeaderBytes];
  const absl::Status answered = link.ReadFull(head, sizeof(head), deadline, "the hello's answer");
  Check(answered.ok(), "no answer to a good hello: " + answered.ToString());
  Check(socket_plane::DecodeReplyHeader(head).code == 0, "a good hello refused");
  return 0;
}
