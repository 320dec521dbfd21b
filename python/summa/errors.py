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
        return SummaError(error.code(), error.details() or "", what)
    return SummaError(grpc.StatusCode.UNKNOWN, str(error), what)
