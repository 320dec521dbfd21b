// summa._native: the C++ client (client/ps_client.h) for Python, through pybind11. The summa
// package (python/summa) wraps it; nothing on its data path runs Python: buffers cross by the
// buffer protocol without a copy (NumPy arrays; a torch CPU tensor's .numpy() shares its
// memory), the GIL is released for every call that waits on the network, and a step's
// overlapped exchange runs on StepExchange's thread (client/step_exchange.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/lease_keeper.h"
#include "client/ps_client.h"
#include "client/step_exchange.h"
#include "common/status_reason.h"

namespace py = pybind11;

namespace summa::worker {
namespace {

// Raised for every failed call: summa.errors turns it into SummaError with the gRPC code.
PyObject* g_error = nullptr;

[[noreturn]] void Raise(const absl::Status& s) {
  py::object error = py::reinterpret_borrow<py::object>(g_error);
  py::object e = error(static_cast<int>(s.code()), std::string(s.message()), std::string(StatusReasonName(ReasonOf(s))));
  PyErr_SetObject(g_error, e.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

// A writable (or read-only) C-contiguous float32 buffer of `floats` values (any when < 0).
struct Floats {
  float* data = nullptr;
  int64_t size = 0;
};
Floats FloatBuffer(const py::buffer& b, bool writable, int64_t floats, const char* what) {
  py::buffer_info info = b.request(writable);
  if (info.format != py::format_descriptor<float>::format() || info.itemsize != sizeof(float)) {
    throw py::type_error(absl::StrCat(what, ": float32 values are needed, not format '", info.format, "'"));
  }
  int64_t expected_stride = sizeof(float);
  for (int d = static_cast<int>(info.ndim) - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected_stride) {
      throw py::value_error(absl::StrCat(what, ": the buffer is not C-contiguous"));
    }
    expected_stride *= info.shape[d];
  }
  if (floats >= 0 && info.size != floats) {
    throw py::value_error(absl::StrCat(what, ": ", info.size, " values; the model has ", floats));
  }
  return {static_cast<float*>(info.ptr), info.size};
}

// A C-contiguous buffer of 64-bit row ids: uint64, or int64 (torch's index dtype) whose values
// must not be negative.
absl::Span<const uint64_t> IdBuffer(const py::buffer& b, const char* what) {
  py::buffer_info info = b.request();
  std::string format = info.format;
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<')) format.erase(0, 1);
  const bool is_unsigned = format == "Q" || format == "L";
  const bool is_signed = format == "q" || format == "l";
  if (info.itemsize != sizeof(uint64_t) || !(is_unsigned || is_signed)) {
    throw py::type_error(absl::StrCat(what, ": uint64 or int64 ids are needed, not format '", info.format, "'"));
  }
  int64_t expected_stride = sizeof(uint64_t);
  for (int d = static_cast<int>(info.ndim) - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected_stride) {
      throw py::value_error(absl::StrCat(what, ": the buffer is not C-contiguous"));
    }
    expected_stride *= info.shape[d];
  }
  const auto* ids = static_cast<const uint64_t*>(info.ptr);
  if (is_signed) {
    for (int64_t i = 0; i < info.size; ++i) {
      if (static_cast<int64_t>(ids[i]) < 0) {
        Raise(absl::InvalidArgumentError(absl::StrCat(what, ": id ", static_cast<int64_t>(ids[i]), " at position ", i,
                                                      " is negative")));
      }
    }
  }
  return absl::MakeConstSpan(ids, static_cast<size_t>(info.size));
}

class NativeClient {
 public:
  // `token_file`, when given, in place of `token`: read again when it changes (ClientToken).
  NativeClient(const std::string& address, double call_timeout, double join_timeout, const std::string& token,
               const std::string& ca, const std::string& cert, const std::string& key, const std::string& plane,
               int channels, const std::string& token_file) {
    absl::StatusOr<DataPlane> parsed = ParseDataPlane(plane);
    Check(parsed.status());
    ClientToken sent = token;
    if (!token_file.empty()) {
      absl::StatusOr<ClientToken> read = ClientToken::FromFile(token_file);
      Check(read.status());
      sent = *std::move(read);
    }
    client_ = std::make_unique<ParameterClient>(address, absl::Seconds(call_timeout), absl::Seconds(join_timeout),
                                                channels, ClientSecurity{TlsFiles{cert, key, ca}, sent});
    client_->set_data_plane(*parsed);
    leases_ = std::make_unique<LeaseKeeper>(client_.get());
  }
  ~NativeClient() { Close(); }

  py::dict Join(int rank, int world, const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs,
                const std::optional<py::buffer>& initial, bool takes_local_steps) {
    client_->set_takes_local_steps(takes_local_steps);
    std::vector<TensorSpec> tensors;
    int64_t total = 0;
    for (const auto& [name, shape] : specs) {
      TensorSpec spec{name, DType::kFloat32, shape};
      total += spec.num_elements();
      tensors.push_back(std::move(spec));
    }
    const float* values = nullptr;
    if (initial.has_value()) values = FloatBuffer(*initial, false, total, "initial values").data;
    absl::StatusOr<JoinInfo> joined;
    {
      py::gil_scoped_release release;
      StopExchange();
      joined = client_->Join(rank, world, tensors, values, "");
      if (joined.ok()) leases_->Start(joined->rank, joined->lease);
    }
    Check(joined.status());
    floats_ = total;
    py::list partitions;
    for (const PartitionRange& p : joined->partitions) partitions.append(py::make_tuple(p.id, p.offset, p.length));
    py::dict d;
    d["rank"] = joined->rank;
    d["version"] = joined->version;
    d["next_step"] = joined->next_step;
    d["mode"] = static_cast<int>(joined->mode);
    d["staleness"] = joined->staleness;
    d["sync_every"] = joined->sync_every;
    d["lease_seconds"] = absl::ToDoubleSeconds(joined->lease);
    d["partitions"] = partitions;
    d["live_ranks"] = joined->live_ranks;
    d["wire_dtype"] = std::string(WireDTypeName(joined->wire_dtype));
    return d;
  }

  uint64_t Pull(uint64_t min_version, const py::buffer& weights) {
    RefuseMidStep("pull");
    float* w = FloatBuffer(weights, true, floats_, "weights").data;
    absl::StatusOr<uint64_t> version;
    {
      py::gil_scoped_release release;
      version = client_->PullAll(min_version, w);
    }
    Check(version.status());
    return *version;
  }

  std::vector<int> PushPull(uint64_t step, int64_t num_examples, const py::buffer& gradients, const py::buffer& weights) {
    RefuseMidStep("push_pull");
    const float* g = FloatBuffer(gradients, false, floats_, "gradients").data;
    float* w = FloatBuffer(weights, true, floats_, "weights").data;
    std::vector<int> live;
    absl::StatusOr<uint64_t> next;
    {
      py::gil_scoped_release release;
      next = client_->PushPull(step, num_examples, g, w, &live);
    }
    Check(next.status());
    if (*next != step + 1) {
      // A late push (summa-server --backup_workers): the weights are a later step's, which this
      // API's caller, counting its own steps, would not know to go on from.
      Check(WithReason(absl::FailedPreconditionError(absl::StrCat(
                           "the push of step ", step, " came after its step completed (summa-server "
                           "--backup_workers) and was dropped; the weights are those of step ", *next,
                           ", which the Python client does not skip to: join again")),
                       StatusReason::kLatePush));
    }
    return live;
  }

  bool Push(uint64_t step, int64_t num_examples, const py::buffer& gradients) {
    RefuseMidStep("push");
    const float* g = FloatBuffer(gradients, false, floats_, "gradients").data;
    absl::StatusOr<bool> completed;
    {
      py::gil_scoped_release release;
      completed = client_->Push(step, num_examples, g);
    }
    Check(completed.status());
    return *completed;
  }

  void AllReduce(const py::buffer& values, const py::buffer& out, const std::string& name, int group_size, int rank,
                 bool members, uint64_t round) {
    RefuseMidStep("allreduce");
    const Floats in = FloatBuffer(values, false, -1, "allreduce values");
    const Floats sum = FloatBuffer(out, true, in.size, "allreduce output");
    Collective group{name, rank, group_size, members, round};
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->AllReduceInto(group, absl::MakeConstSpan(in.data, in.size), absl::MakeSpan(sum.data, sum.size));
    }
    Check(s);
  }

  // The job's embedding tables, each a serialized summa.v1.EmbeddingTableSpec, for the next join.
  void SetTables(const std::vector<py::bytes>& tables) {
    std::vector<summa::v1::EmbeddingTableSpec> specs(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      if (!specs[i].ParseFromString(std::string(tables[i]))) {
        Raise(absl::InvalidArgumentError(
            absl::StrCat("set_tables: table ", i, " is not a serialized summa.v1.EmbeddingTableSpec")));
      }
    }
    client_->set_tables(std::move(specs));
  }

  // The rows of `ids` of table `table` into `rows` (len(ids) x dim float32). Thread-safe against
  // the dense calls and an overlapped step: the sparse calls have connections of their own.
  uint64_t SparsePull(uint32_t table, uint64_t min_version, const py::buffer& ids, const py::buffer& rows) {
    const absl::Span<const uint64_t> id_span = IdBuffer(ids, "ids");
    float* r = RowBuffer(table, id_span.size(), rows, true, "rows").data;
    absl::StatusOr<uint64_t> version;
    {
      py::gil_scoped_release release;
      version = client_->SparsePull(table, min_version, id_span, r);
    }
    Check(version.status());
    return *version;
  }

  bool SparsePush(uint32_t table, uint64_t step, int64_t num_examples, const py::buffer& ids, const py::buffer& grads) {
    const absl::Span<const uint64_t> id_span = IdBuffer(ids, "ids");
    const float* g = RowBuffer(table, id_span.size(), grads, false, "grads").data;
    absl::StatusOr<bool> completed;
    {
      py::gil_scoped_release release;
      completed = client_->SparsePush(table, step, num_examples, id_span, g);
    }
    Check(completed.status());
    return *completed;
  }

  void Heartbeat(int rank) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->Heartbeat(rank);
    }
    Check(s);
  }

  void Leave(int rank) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      StopExchange();
      leases_->Stop();
      s = client_->Leave(rank);
    }
    Check(s);
  }

  void Close() {
    if (client_ == nullptr) return;
    py::gil_scoped_release release;
    StopExchange();
    leases_->Stop();
  }

  bool on_socket_plane() const { return client_->on_socket_plane(); }
  bool on_shm_plane() const { return client_->on_shm_plane(); }

  // `floats` zeroed float32 values in the shared-memory plane's values segment, as a numpy array
  // that keeps this client alive (ParameterClient::SharedValues): gradients pushed from it are
  // not copied. None on any other plane.
  py::object SharedFloats(size_t floats) {
    absl::StatusOr<float*> values;
    {
      py::gil_scoped_release release;
      values = client_->SharedValues(floats);
    }
    Check(values.status());
    if (*values == nullptr) return py::none();
    return py::array_t<float>({floats}, {sizeof(float)}, *values, py::cast(this, py::return_value_policy::reference));
  }

  // The overlapped step (client/step_exchange.h). The buffers are held until Finish.
  void Begin(uint64_t step, int64_t num_examples, const py::buffer& gradients, const py::buffer& weights) {
    const float* g = FloatBuffer(gradients, false, floats_, "gradients").data;
    float* w = FloatBuffer(weights, true, floats_, "weights").data;
    if (exchange_ == nullptr) exchange_ = std::make_unique<StepExchange>(client_.get());
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = exchange_->Begin(step, num_examples, g, w);
    }
    Check(s);
    held_ = {gradients, weights};
  }
  void Ready(size_t i) { Exchange().Ready(i); }
  void ReadyAll() { Exchange().ReadyAll(); }
  void Wait(size_t i) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = Exchange().Wait(i);
    }
    Check(s);
  }
  std::vector<int> Finish() {
    std::vector<int> live;
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = Exchange().Finish(&live);
    }
    held_.clear();
    Check(s);
    return live;
  }
  // The group partition i's reply named (the next step's); after Wait(i).
  std::vector<int> LiveRanksOf(size_t i) { return Exchange().live_ranks(i); }
  bool active() const { return exchange_ != nullptr && exchange_->active(); }
  std::vector<std::tuple<int64_t, int64_t, int64_t>> Timeline() const {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
    if (exchange_ == nullptr) return out;
    for (const StepExchange::Times& t : exchange_->timeline()) out.emplace_back(t.ready_ns, t.start_ns, t.end_ns);
    return out;
  }

 private:
  // A float32 buffer of `ids` rows of table `table`.
  Floats RowBuffer(uint32_t table, size_t ids, const py::buffer& b, bool writable, const char* what) const {
    const absl::StatusOr<int> dim = client_->TableDim(table);
    Check(dim.status());
    const Floats f = FloatBuffer(b, writable, -1, what);
    const int64_t want = static_cast<int64_t>(ids) * *dim;
    if (f.size != want) {
      throw py::value_error(absl::StrCat(what, ": ", f.size, " values; ", ids, " ids of table ", table, "'s ", *dim,
                                         " floats are ", want));
    }
    return f;
  }
  StepExchange& Exchange() {
    if (exchange_ == nullptr) throw py::value_error("no overlapped step has begun");
    return *exchange_;
  }
  // The data path belongs to the exchange's thread while a step is in flight.
  void RefuseMidStep(const char* what) const {
    if (active()) {
      Raise(absl::FailedPreconditionError(absl::StrCat(
          what, " while an overlapped step is in flight (its optimizer's synchronize() ends it)")));
    }
  }
  // Ends a step still in flight (its calls all have deadlines) before the client is used
  // otherwise. Called without the GIL.
  void StopExchange() {
    if (exchange_ != nullptr && exchange_->active()) exchange_->Finish().IgnoreError();
  }

  std::unique_ptr<ParameterClient> client_;
  std::unique_ptr<LeaseKeeper> leases_;
  std::unique_ptr<StepExchange> exchange_;
  std::vector<py::buffer> held_;
  int64_t floats_ = -1;
};

}  // namespace
}  // namespace summa::worker

PYBIND11_MODULE(_native, m) {
  using summa::worker::NativeClient;
  m.doc() = "Summa's C++ client (summa/client.py wraps it)";
  // NativeError(code, message, reason): code is an absl/gRPC status code number.
  static py::exception<std::runtime_error> error(m, "NativeError");
  summa::worker::g_error = error.ptr();
  py::class_<NativeClient>(m, "Client")
      .def(py::init<const std::string&, double, double, const std::string&, const std::string&, const std::string&,
                    const std::string&, const std::string&, int, const std::string&>(),
           py::arg("address"), py::arg("call_timeout"), py::arg("join_timeout"), py::arg("token") = "",
           py::arg("ca") = "", py::arg("cert") = "", py::arg("key") = "", py::arg("data_plane") = "auto",
           py::arg("channels") = 1, py::arg("token_file") = "")
      .def("join", &NativeClient::Join, py::arg("rank"), py::arg("world"), py::arg("specs"), py::arg("initial"),
           py::arg("takes_local_steps") = false)
      .def("pull", &NativeClient::Pull)
      .def("push_pull", &NativeClient::PushPull)
      .def("push", &NativeClient::Push)
      .def("allreduce", &NativeClient::AllReduce, py::arg("values"), py::arg("out"), py::arg("name"),
           py::arg("group_size"), py::arg("rank"), py::arg("members") = false, py::arg("round") = 0)
      .def("set_tables", &NativeClient::SetTables, py::arg("tables"))
      .def("sparse_pull", &NativeClient::SparsePull, py::arg("table"), py::arg("min_version"), py::arg("ids"),
           py::arg("rows"))
      .def("sparse_push", &NativeClient::SparsePush, py::arg("table"), py::arg("step"), py::arg("num_examples"),
           py::arg("ids"), py::arg("grads"))
      .def("heartbeat", &NativeClient::Heartbeat)
      .def("leave", &NativeClient::Leave)
      .def("close", &NativeClient::Close)
      .def_property_readonly("on_socket_plane", &NativeClient::on_socket_plane)
      .def_property_readonly("on_shm_plane", &NativeClient::on_shm_plane)
      .def("shared_floats", &NativeClient::SharedFloats, py::arg("floats"))
      .def("begin", &NativeClient::Begin)
      .def("ready", &NativeClient::Ready)
      .def("ready_all", &NativeClient::ReadyAll)
      .def("wait", &NativeClient::Wait)
      .def("finish", &NativeClient::Finish)
      .def("live_ranks_of", &NativeClient::LiveRanksOf)
      .def_property_readonly("active", &NativeClient::active)
      .def("timeline", &NativeClient::Timeline);
}
