// opbridge native kernels: the ORT-independent interface each op's kernel is written against.
//
// A kernel is a plain function over spans whose parameters mirror the op's schema; a thin
// adapter (make_kernel) reads attributes once at kernel creation and unpacks inputs at compute
// time. Only register.cc knows the ONNX Runtime ABI.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// The x86 paths this build holds and the function attributes that compile a loop for them.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(OPBRIDGE_BASELINE_ONLY)
#define OPBRIDGE_X86_DISPATCH 1
#define OPBRIDGE_AVX2 __attribute__((target("avx2,fma,prfchw")))
#if !defined(OPBRIDGE_NO_AVX512)
#define OPBRIDGE_X86_AVX512 1
#define OPBRIDGE_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma,prfchw")))
#else
#define OPBRIDGE_X86_AVX512 0
#endif
#else
#define OPBRIDGE_X86_DISPATCH 0
#define OPBRIDGE_X86_AVX512 0
#endif

namespace opbridge {

// Element types, numbered as ONNX TensorProto.DataType (ONNX Runtime uses the same numbers).
enum class DType : int32_t {
  kUndefined = 0, kFloat = 1, kUInt8 = 2, kInt8 = 3, kUInt16 = 4, kInt16 = 5, kInt32 = 6, kInt64 = 7,
  kString = 8, kBool = 9, kFloat16 = 10, kDouble = 11, kUInt32 = 12, kUInt64 = 13, kBFloat16 = 16,
};

const char* dtype_name(DType t);
size_t dtype_size(DType t);  // 0 for non-numeric

// Error or success; the message names the op's input and the bad value (the adapter adds the op).
class Status {
 public:
  Status() = default;  // OK
  static Status OK() { return Status(); }
  static Status Error(std::string msg) { return Status(std::move(msg)); }
  bool ok() const { return !failed_; }
  const std::string& message() const { return msg_; }

 private:
  explicit Status(std::string msg) : failed_(true), msg_(std::move(msg)) {}
  bool failed_ = false;
  std::string msg_;
};

#define OPBRIDGE_RETURN_IF_ERROR(expr)      \
  do {                                      \
    ::opbridge::Status _st = (expr);        \
    if (!_st.ok()) return _st;              \
  } while (0)

// Builds a message from streamable parts: Fail("input 'x' has ", n, " dims").
template <typename... Parts>
Status Fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return Status::Error(os.str());
}

template <typename T>
struct Span {
  T* data = nullptr;
  int64_t size = 0;
  T& operator[](int64_t i) const { return data[i]; }
  T* begin() const { return data; }
  T* end() const { return data + size; }
};

std::string shape_str(const std::vector<int64_t>& shape);

struct TensorView {
  DType dtype = DType::kUndefined;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  template <typename T>
  Span<const T> span() const { return {static_cast<const T*>(data), numel()}; }
};

// Attribute access at kernel creation (missing required attributes are errors).
class Attributes {
 public:
  virtual ~Attributes() = default;
  virtual Status get(const char* name, int64_t* out) const = 0;
  virtual Status get(const char* name, float* out) const = 0;
  virtual Status get(const char* name, std::string* out) const = 0;
  virtual Status get(const char* name, std::vector<int64_t>* out) const = 0;
  virtual Status get(const char* name, std::vector<float>* out) const = 0;
};

// One kernel call: inputs, output allocation, and a thread pool.
class Context {
 public:
  virtual ~Context() = default;
  virtual int num_inputs() const = 0;
  virtual const TensorView& input(int i) const = 0;
  virtual Status output(int i, const std::vector<int64_t>& shape, void** data) = 0;
  // Runs fn(begin, end) over [0, n) in chunks of at least `grain`, on the host's threads.
  virtual void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) = 0;

  template <typename T>
  Status output(int i, const std::vector<int64_t>& shape, Span<T>* out) {
    void* data = nullptr;
    OPBRIDGE_RETURN_IF_ERROR(output(i, shape, &data));
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    *out = Span<T>{static_cast<T*>(data), n};
    return Status::OK();
  }
};

// What the registration unit needs from one op's kernel file. The file defines its entry, in
// namespace opbridge, under a name derived from the op's full ONNX name (bridge/core/basics/opnames.py):
//   extern const KernelDef kernel_<domain>_op_<op type> = make_kernel<State>();
// with the domain's '_', '.' and '-' written "_u", "_d" and "_h" (opbridge::crop -> kernel_opbridge_op_crop,
// com.example::scale -> kernel_com_dexample_op_scale); a seed op's file is cpu/<domain>_op_<op type>.cc.
struct KernelDef {
  void* (*create)(const Attributes& attrs, Status* status);
  void (*destroy)(void* state);
  Status (*compute)(const void* state, Context& ctx);
};

// State = struct with `static Status Read(const Attributes&, State*)` and
// `Status Compute(Context&) const`.
template <typename State>
KernelDef make_kernel() {
  return KernelDef{
      [](const Attributes& attrs, Status* status) -> void* {
        auto* state = new State();
        *status = State::Read(attrs, state);
        if (!status->ok()) {
          delete state;
          return nullptr;
        }
        return state;
      },
      [](void* state) { delete static_cast<State*>(state); },
      [](const void* state, Context& ctx) { return static_cast<const State*>(state)->Compute(ctx); },
  };
}

// Shape checks shared by kernels; messages name the input and show the actual shape.
Status expect_rank(const TensorView& t, const char* name, size_t rank);
Status expect_min_rank(const TensorView& t, const char* name, size_t rank);

// IEEE half <-> float (round to nearest even), independent of compiler support for _Float16.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// The vector instruction set the kernels' hot loops run: the best one this build holds and this CPU
// runs, capped by $OPBRIDGE_ISA ("baseline", "avx2", "avx512"; unset, empty or "auto": no cap), so
// every path can be timed on one machine. Decided once per process. Builds: -DOPBRIDGE_NO_AVX512
// leaves out the AVX-512 path, -DOPBRIDGE_BASELINE_ONLY both x86 paths (OPBRIDGE_X86_* below).
enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
Isa isa();
const char* isa_name(Isa level);
inline bool isa_at_least(Isa level) { return static_cast<int>(isa()) >= static_cast<int>(level); }
// $OPBRIDGE_ISA when it names no path (the library then refuses to register), else nullptr.
const char* isa_env_invalid();

}  // namespace opbridge
