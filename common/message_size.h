// The largest summa.v1 message: what Summa's clients send and take, and the server's limit unless
// set otherwise (summa-server --max_message_bytes, server/core/limits.h). gRPC's default 4 MB
// receive limit is too tight for a 4 MB partition plus its envelope. No gRPC here, so that the
// server's core shares the one value with the RPC glue.
#ifndef SUMMA_COMMON_MESSAGE_SIZE_H_
#define SUMMA_COMMON_MESSAGE_SIZE_H_

namespace summa {

inline constexpr int kMaxMessageBytes = 256 << 20;

}  // namespace summa

#endif  // SUMMA_COMMON_MESSAGE_SIZE_H_
