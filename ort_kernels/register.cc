// The registration unit: exports RegisterCustomOps(OrtSessionOptions*, const OrtApiBase*), the entry
// point ONNX Runtime hosts call for a custom-op library (SessionOptions.register_custom_ops_library
// in Python, RegisterCustomOpsLibrary in C/C++). Every op of the generated table is added to its
// own domain; kernels see only the ORT-independent interface of opbridge_kernel.h. The table (domain,
// op type, entry symbol per op) is generated with the names of bridge/core/basics/opnames.py, so an entry
// belongs to one full ONNX name.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "opbridge_kernel.h"
#include "opbridge_registry.h"
#include "ort_abi.h"

namespace opbridge {
namespace {

const OrtApi* g_api = nullptr;

// Runs an ORT call; a failure becomes a Status carrying ORT's message.
Status ort_call(OrtStatus* st, const char* what) {
  if (st == nullptr) return Status::OK();
  std::string msg = std::string(what) + ": " + g_api->GetErrorMessage(st);
  g_api->ReleaseStatus(st);
  return Status::Error(msg);
}

class OrtAttributes final : public Attributes {
 public:
  explicit OrtAttributes(const OrtKernelInfo* info) : info_(info) {}

  Status get(const char* name, int64_t* out) const override {
    return scalar(name, "an int", g_api->KernelInfoGetAttribute_int64(info_, name, out));
  }
  Status get(const char* name, float* out) const override {
    return scalar(name, "a float", g_api->KernelInfoGetAttribute_float(info_, name, out));
  }
  Status get(const char* name, std::string* out) const override {
    OrtStatus* st = read_string(name, out);
    return scalar(name, "a string", st);
  }
  Status get(const char* name, std::vector<int64_t>* out) const override {
    return array(g_api->KernelInfoGetAttributeArray_int64, name, "ints", out);
  }
  Status get(const char* name, std::vector<float>* out) const override {
    return array(g_api->KernelInfoGetAttributeArray_float, name, "floats", out);
  }

 private:
  OrtStatus* read_string(const char* name, std::string* out) const {
    size_t size = 0;
    OrtStatus* st = g_api->KernelInfoGetAttribute_string(info_, name, nullptr, &size);
    if (st != nullptr) return st;
    out->assign(size, '\0');
    st = g_api->KernelInfoGetAttribute_string(info_, name, &(*out)[0], &size);
    out->resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    return st;
  }

  // ORT's array getters: a first call with no buffer gives the size, a second fills it.
  template <typename T, typename Getter>
  OrtStatus* read_array(Getter getter, const char* name, std::vector<T>* out) const {
    size_t size = 0;
    OrtStatus* st = getter(info_, name, nullptr, &size);
    if (st != nullptr) return st;
    out->resize(size);
    return size == 0 ? nullptr : getter(info_, name, out->data(), &size);
  }

  template <typename T, typename Getter>
  Status array(Getter getter, const char* name, const char* want, std::vector<T>* out) const {
    OrtStatus* st = read_array(getter, name, out);
    // NOTE: ORT's array getters do not check the attribute's type (a list of another type reads as
    // empty): an empty list is checked against what the node really holds.
    if (st == nullptr && !out->empty()) return Status::OK();
    std::string got = actual(name);
    if (st == nullptr && (got == "nothing" || got == "an empty list")) return Status::OK();
    return wrong(name, want, got, st);
  }

  Status scalar(const char* name, const char* want, OrtStatus* st) const {
    return st == nullptr ? Status::OK() : wrong(name, want, actual(name), st);
  }

  Status wrong(const char* name, const char* want, const std::string& got, OrtStatus* st) const {
    if (st != nullptr) g_api->ReleaseStatus(st);
    if (got == "nothing")
      return Fail("attribute '", name, "' is missing or has the wrong type (neither a number, a string nor a list); ",
                  "the node must carry it as ", want);
    return Fail("attribute '", name, "' must be ", want, ", got ", got);
  }

  // What the node holds under `name`, for messages: "an int 3", "floats [1.5, 2]", "a string 'a'".
  // Scalars first: ORT's scalar getters do check the type.
  std::string actual(const char* name) const {
    int64_t i = 0;
    float f = 0;
    std::string s;
    std::vector<int64_t> ints;
    std::vector<float> floats;
    if (probe(g_api->KernelInfoGetAttribute_int64(info_, name, &i))) return "an int " + std::to_string(i);
    if (probe(g_api->KernelInfoGetAttribute_float(info_, name, &f))) return "a float " + number(f);
    if (probe(read_string(name, &s))) return "a string '" + s + "'";
    bool present = probe(read_array(g_api->KernelInfoGetAttributeArray_int64, name, &ints));
    if (!ints.empty()) return "ints " + shape_str(ints);
    present = probe(read_array(g_api->KernelInfoGetAttributeArray_float, name, &floats)) || present;
    if (!floats.empty()) {
      std::string text = "floats [";
      for (size_t k = 0; k < floats.size(); ++k) text += (k ? ", " : "") + number(floats[k]);
      return text + "]";
    }
    return present ? "an empty list" : "nothing";
  }

  static bool probe(OrtStatus* st) {
    if (st == nullptr) return true;
    g_api->ReleaseStatus(st);
    return false;
  }

  static std::string number(float v) {
    std::ostringstream os;
    os << v;
    return os.str();
  }

  const OrtKernelInfo* info_;
};

class OrtContext final : public Context {
 public:
  explicit OrtContext(OrtKernelContext* ctx) : ctx_(ctx) {}

  Status Load(size_t expected_inputs) {
    size_t count = 0;
    OPBRIDGE_RETURN_IF_ERROR(ort_call(g_api->KernelContext_GetInputCount(ctx_, &count), "GetInputCount"));
    if (count > expected_inputs) return Fail("expected at most ", expected_inputs, " inputs, got ", count);
    inputs_.assign(expected_inputs, TensorView{});  // trailing omitted optional inputs stay kUndefined
    for (size_t i = 0; i < count; ++i) {
      const OrtValue* value = nullptr;
      OPBRIDGE_RETURN_IF_ERROR(ort_call(g_api->KernelContext_GetInput(ctx_, i, &value), "GetInput"));
      if (value == nullptr) continue;  // an omitted optional input
      OPBRIDGE_RETURN_IF_ERROR(describe(value, &inputs_[i]));
      void* data = nullptr;
      OPBRIDGE_RETURN_IF_ERROR(ort_call(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &data),
                                        "GetTensorMutableData"));
      inputs_[i].data = data;
    }
    return Status::OK();
  }

  int num_inputs() const override { return static_cast<int>(inputs_.size()); }
  const TensorView& input(int i) const override { return inputs_[static_cast<size_t>(i)]; }

  Status output(int i, const std::vector<int64_t>& shape, void** data) override {
    OrtValue* value = nullptr;
    OPBRIDGE_RETURN_IF_ERROR(ort_call(
        g_api->KernelContext_GetOutput(ctx_, static_cast<size_t>(i), shape.data(), shape.size(), &value),
        "GetOutput"));
    return ort_call(g_api->GetTensorMutableData(value, data), "GetTensorMutableData");
  }

  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) override {
    if (n <= 0) return;
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(n / std::max<int64_t>(grain, 1), 4 * threads()));
    if (chunks == 1) {
      fn(0, n);
      return;
    }
    struct Job {
      const std::function<void(int64_t, int64_t)>* fn;
      int64_t n, chunks;
    } job{&fn, n, chunks};
    // NOTE: ORT's intra-op pool runs the chunks, so the session's thread settings apply.
    OrtStatus* st = g_api->KernelContext_ParallelFor(
        ctx_,
        [](void* data, size_t chunk) {
          const Job& j = *static_cast<const Job*>(data);
          const int64_t c = static_cast<int64_t>(chunk);
          (*j.fn)(j.n * c / j.chunks, j.n * (c + 1) / j.chunks);
        },
        static_cast<size_t>(chunks), 0, &job);
    if (st != nullptr) {  // no pool available: run serially rather than fail
      g_api->ReleaseStatus(st);
      fn(0, n);
    }
  }

 private:
  static int64_t threads() {
    static const int64_t n = std::max<unsigned>(1, std::thread::hardware_concurrency());
    return n;
  }

  static Status describe(const OrtValue* value, TensorView* view) {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    OPBRIDGE_RETURN_IF_ERROR(ort_call(g_api->GetTensorTypeAndShape(value, &info), "GetTensorTypeAndShape"));
    ONNXTensorElementDataType type;
    size_t rank = 0;
    Status st = ort_call(g_api->GetTensorElementType(info, &type), "GetTensorElementType");
    if (st.ok()) st = ort_call(g_api->GetDimensionsCount(info, &rank), "GetDimensionsCount");
    if (st.ok()) {
      view->shape.resize(rank);
      st = ort_call(g_api->GetDimensions(info, view->shape.data(), rank), "GetDimensions");
    }
    g_api->ReleaseTensorTypeAndShapeInfo(info);
    view->dtype = static_cast<DType>(type);
    return st;
  }

  OrtKernelContext* ctx_;
  std::vector<TensorView> inputs_;
};

OrtStatus* to_ort(const OpEntry& op, const Status& st) {
  if (st.ok()) return nullptr;
  std::string msg = std::string("opbridge: ") + op.domain + "::" + op.name + ": " + st.message();
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str());
}

// Runs fn, mapping any C++ exception to an error status (bad_alloc: the allocation was too large).
template <typename Fn>
OrtStatus* guarded(const OpEntry& op, const char* what, Fn&& fn) {
  try {
    return to_ort(op, fn());
  } catch (const std::bad_alloc&) {
    return to_ort(op, Fail("out of memory while ", what, " (an input or attribute asks for more memory than ",
                           "the machine has; check the sizes)"));
  } catch (const std::exception& e) {
    return to_ort(op, Fail("C++ exception while ", what, ": ", e.what()));
  } catch (...) {
    return to_ort(op, Fail("unknown C++ exception while ", what));
  }
}

struct Kernel {
  const OpEntry* op;
  void* state;
};

// One OrtCustomOp per table entry; the entry pointer follows the struct (first member).
struct TypedOp {
  OrtCustomOp base;
  const OpEntry* entry;
};

const OpEntry& entry_of(const OrtCustomOp* op) { return *reinterpret_cast<const TypedOp*>(op)->entry; }

OrtCustomOp make_custom_op() {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof op);
  op.version = kOrtCustomOpVersion;
  op.GetName = [](const OrtCustomOp* self) { return entry_of(self).name; };
  op.GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
  op.GetInputType = [](const OrtCustomOp* self, size_t i) {
    return static_cast<ONNXTensorElementDataType>(entry_of(self).input_types[i]);
  };
  op.GetInputTypeCount = [](const OrtCustomOp* self) { return static_cast<size_t>(entry_of(self).num_inputs); };
  op.GetOutputType = [](const OrtCustomOp* self, size_t i) {
    return static_cast<ONNXTensorElementDataType>(entry_of(self).output_types[i]);
  };
  op.GetOutputTypeCount = [](const OrtCustomOp* self) { return static_cast<size_t>(entry_of(self).num_outputs); };
  op.KernelDestroy = [](void* kernel) {
    auto* k = static_cast<Kernel*>(kernel);
    if (k != nullptr) k->op->kernel->destroy(k->state);
    delete k;
  };
  op.GetInputCharacteristic = [](const OrtCustomOp* self, size_t i) {
    return (entry_of(self).optional_mask >> i) & 1u ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  };
  op.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  // NOTE: no C++ exception may cross into ONNX Runtime (it would terminate the host): both entry
  // points turn every exception into an error status naming the op.
  op.CreateKernelV2 = [](const OrtCustomOp* self, const OrtApi*, const OrtKernelInfo* info,
                         void** kernel) -> OrtStatus* {
    const OpEntry& e = entry_of(self);
    return guarded(e, "creating the kernel", [&]() -> Status {
      OrtAttributes attrs(info);
      Status st;
      void* state = e.kernel->create(attrs, &st);  // attributes are read once, here
      if (!st.ok()) return st;
      *kernel = new Kernel{&e, state};
      return Status::OK();
    });
  };
  op.KernelComputeV2 = [](void* kernel, OrtKernelContext* context) -> OrtStatus* {
    const Kernel& k = *static_cast<const Kernel*>(kernel);
    return guarded(*k.op, "running", [&]() -> Status {
      OrtContext ctx(context);
      Status st = ctx.Load(static_cast<size_t>(k.op->num_inputs));
      if (st.ok()) st = k.op->kernel->compute(k.state, ctx);
      return st;
    });
  };
  op.GetStartVersion = [](const OrtCustomOp* self) { return entry_of(self).version; };
  op.GetEndVersion = [](const OrtCustomOp* self) { return entry_of(self).version; };
  return op;
}

struct Library {
  std::vector<std::unique_ptr<TypedOp>> ops;
  std::vector<OrtCustomOpDomain*> domains;
  OrtStatus* error = nullptr;
};

// NOTE: ops and domains are built once per process and shared by every session; ORT requires
// them to outlive the sessions that use them, so they are never released.
Library* build_library() {
  auto* lib = new Library();
  std::map<std::string, OrtCustomOpDomain*> by_name;
  for (size_t i = 0; i < kOpTableSize; ++i) {
    const OpEntry& e = kOpTable[i];
    auto op = std::make_unique<TypedOp>();
    op->base = make_custom_op();
    op->entry = &e;
    OrtCustomOpDomain*& domain = by_name[e.domain];
    if (domain == nullptr) {
      if ((lib->error = g_api->CreateCustomOpDomain(e.domain, &domain)) != nullptr) return lib;
      lib->domains.push_back(domain);
    }
    if ((lib->error = g_api->CustomOpDomain_Add(domain, &op->base)) != nullptr) return lib;
    lib->ops.push_back(std::move(op));
  }
  return lib;
}

}  // namespace
}  // namespace opbridge

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace opbridge;
  static std::once_flag once;
  static Library* lib = nullptr;
  static const OrtApi* api = nullptr;
  std::call_once(once, [&] {
    api = api_base->GetApi(kOrtApiVersionRequired);
    if (api == nullptr) return;
    g_api = api;
    try {
      lib = build_library();
    } catch (...) {
      lib = nullptr;
    }
  });
  if (api == nullptr) {  // host older than the API we need: API 1 is always there to say so
    const OrtApi* v1 = api_base->GetApi(1);
    std::string msg = std::string("opbridge: this ONNX Runtime (") + api_base->GetVersionString() +
                      ") lacks C API version " + std::to_string(kOrtApiVersionRequired) +
                      "; the opbridge kernels need ONNX Runtime 1." + std::to_string(kOrtApiVersionRequired) + " or newer";
    return v1 != nullptr ? v1->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  if (const char* isa = isa_env_invalid()) {
    const std::string msg = std::string("opbridge: OPBRIDGE_ISA names no kernel path. Got '") + isa +
                            "'. Set it to auto, avx512, avx2 or baseline (any case), or unset it.";
    return api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str());
  }
  if (lib == nullptr) return api->CreateStatus(ORT_FAIL, "opbridge: the op table could not be built (out of memory)");
  if (lib->error != nullptr) return api->CreateStatus(ORT_FAIL, api->GetErrorMessage(lib->error));
  for (OrtCustomOpDomain* domain : lib->domains) {
    if (OrtStatus* st = api->AddCustomOpDomain(options, domain)) return st;
  }
  return nullptr;
}

// For hosts and tests that want to know what the library serves: "domain::name:version" lines.
extern "C" __attribute__((visibility("default"))) const char* OpbridgeServedOps() {
  static const std::string text = [] {
    std::string s;
    for (size_t i = 0; i < opbridge::kOpTableSize; ++i) {
      const opbridge::OpEntry& e = opbridge::kOpTable[i];
      s += std::string(e.domain) + "::" + e.name + ":" + std::to_string(e.version) + ":" +
           opbridge::dtype_name(static_cast<opbridge::DType>(e.input_types[0])) + "\n";
    }
    return s;
  }();
  return text.c_str();
}

// The vector ISA path the kernels' hot loops take in this process: "avx512", "avx2" or "baseline".
extern "C" __attribute__((visibility("default"))) const char* OpbridgeIsa() {
  return opbridge::isa_name(opbridge::isa());
}
