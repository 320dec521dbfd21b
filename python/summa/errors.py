"""SummaError: a failed call, carrying the server's gRPC status code, message and reason."""
import grpc

from .v1 import summa_pb2 as pb

_ERROR_INFO_URL = "type.googleapis.com/google.rpc.ErrorInfo"


def reason_of(error):
    """The reason the server gave for refusing a call ("STALE_VIEW", "JOIN_RATE"; see RpcStatus in
    summa.proto), read from the status details, never from the message; "" when it gave none."""
    try:
        trailers = error.trailing_metadata() or ()
    except Exception:  # not an RPC's error
        return ""
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        status = pb.RpcStatus()
        try:
            status.ParseFromString(value)
        except Exception:
            return ""
        for any_detail in status.details:
            if any_detail.type_url != _ERROR_INFO_URL:
                continue
            info = pb.ErrorInfo()
            try:
                info.ParseFromString(any_detail.value)
            except Exception:
                continue
            if info.domain == "summa.v1":
                return info.reason
    return ""


def refused_for_join_rate(error):
    """Whether a Join was refused for coming faster than summa-server --join_rate (try again a
    moment later): the reason says so, or, from a server before reasons, its message names the
    flag (for one release)."""
    reason = reason_of(error)
    if reason:
        return reason == "JOIN_RATE"
    return "--join_rate" in (error.details() or "")


class SummaError(Exception):
    """A call to summa-server failed. `code` is a grpc.StatusCode (INVALID_ARGUMENT for a bad
    shape, FAILED_PRECONDITION for a fenced session, RESOURCE_EXHAUSTED naming the server flag of
    a limit...), `message` the server's text, `what` the call that failed."""

    def __init__(self, code, message, what="", reason=""):
        self.code = code
        self.message = message
        self.what = what
        self.reason = reason
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}{code.name}: {message}")


def from_rpc(error, what):
    """The SummaError for a grpc.RpcError raised by a call described by `what`."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        message = error.details() or ""
        if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "message larger than max" in message:
            # gRPC's transport refuses it before Summa sees it; name the flag, as summa-worker does.
            message += " (summa-server --max_message_bytes)"
        return SummaError(error.code(), message, what, reason_of(error))
    return SummaError(grpc.StatusCode.UNKNOWN, str(error), what)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def from_native(error, what):
    """The SummaError for summa._native.NativeError(code, message, reason) (the C++ client's
    absl status: the same code numbers as gRPC's)."""
    code, message, reason = error.args
    return SummaError(_CODES.get(code, grpc.StatusCode.UNKNOWN), message, what, reason)
