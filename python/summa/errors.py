"""SummaError: a failed call, carrying the server's gRPC status code and message."""
import grpc


class SummaError(Exception):
    """A call to summa-server failed. `code` is a grpc.StatusCode (INVALID_ARGUMENT for a bad
    shape, FAILED_PRECONDITION for a fenced session, RESOURCE_EXHAUSTED naming the server flag of
    a limit...), `message` the server's text, `what` the call that failed."""

    def __init__(self, code, message, what=""):
        self.code = code
        self.message = message
        self.what = what
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}{code.name}: {message}")


def from_rpc(error, what):
    """The SummaError for a grpc.RpcError raised by a call described by `what`."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        message = error.details() or ""
        if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "message larger than max" in message:
            # gRPC's transport refuses it before Summa sees it; name the flag, as summa-worker does.
            message += " (summa-server --max_message_bytes)"
        return SummaError(error.code(), message, what)
    return SummaError(grpc.StatusCode.UNKNOWN, str(error), what)
