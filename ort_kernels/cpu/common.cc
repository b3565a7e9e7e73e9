// Shared helpers of the opbridge kernels (no ONNX Runtime dependency).
#include <cctype>
#include <cstdlib>

#include "opbridge_kernel.h"

namespace opbridge {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat: return "float32";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kUInt16: return "uint16";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kString: return "string";
    case DType::kBool: return "bool";
    case DType::kFloat16: return "float16";
    case DType::kDouble: return "float64";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kBFloat16: return "bfloat16";
    default: return "undefined";
  }
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kUInt8: case DType::kInt8: case DType::kBool: return 1;
    case DType::kUInt16: case DType::kInt16: case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kFloat: case DType::kInt32: case DType::kUInt32: return 4;
    case DType::kInt64: case DType::kDouble: case DType::kUInt64: return 8;
    default: return 0;
  }
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status expect_rank(const TensorView& t, const char* name, size_t rank) {
  if (t.shape.size() != rank)
    return Fail("input '", name, "' must have ", rank, " dims, got shape ", shape_str(t.shape));
  return Status::OK();
}

Status expect_min_rank(const TensorView& t, const char* name, size_t rank) {
  if (t.shape.size() < rank)
    return Fail("input '", name, "' must have at least ", rank, " dims, got shape ", shape_str(t.shape));
  return Status::OK();
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {  // inf / nan
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // zero
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)  // inf or nan (keep nan quiet and non-zero)
    return sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u | ((abs >> 13) & 0x3FFu) : 0u);
  if (abs >= 0x477FF000u)  // rounds to >= 65520: overflow to inf
    return sign | 0x7C00u;
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half_mant & 1u))) ++half_mant;
    return sign | static_cast<uint16_t>(half_mant);
  }
  uint32_t rebased = abs - 0x38000000u;  // exponent 127 -> 15
  uint32_t half_bits = rebased >> 13;
  uint32_t rem = rebased & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (half_bits & 1u))) ++half_bits;
  return sign | static_cast<uint16_t>(half_bits);
}

const char* isa_name(Isa level) {
  switch (level) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "baseline";
  }
}

namespace {

Isa cpu_isa() {
#if OPBRIDGE_X86_DISPATCH
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Isa::kBaseline;
#if OPBRIDGE_X86_AVX512
  // NOTE: libgcc's avx512f also checks that the OS saves the 64-byte registers
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return Isa::kAvx512;
#endif
  return Isa::kAvx2;
#else
  return Isa::kBaseline;
#endif
}

// Whether `v` spells `name` (lower case), in any case: AVX2 and Avx2 name the avx2 path.
bool same_name(const char* v, const char* name) {
  for (; *v != '\0' && *name != '\0'; ++v, ++name)
    if (std::tolower(static_cast<unsigned char>(*v)) != *name) return false;
  return *v == '\0' && *name == '\0';
}

// $OPBRIDGE_ISA as a level: -1 no cap, -2 a value naming no path.
int isa_cap() {
  const char* v = std::getenv("OPBRIDGE_ISA");
  if (v == nullptr || *v == '\0' || same_name(v, "auto")) return -1;
  for (Isa level : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512})
    if (same_name(v, isa_name(level))) return static_cast<int>(level);
  return -2;
}

}  // namespace

Isa isa() {
  static const Isa chosen = [] {
    const int cap = isa_cap();
    const Isa best = cpu_isa();
    return cap >= 0 && cap < static_cast<int>(best) ? static_cast<Isa>(cap) : best;
  }();
  return chosen;
}

const char* isa_env_invalid() {
  static const bool invalid = isa_cap() == -2;
  return invalid ? std::getenv("OPBRIDGE_ISA") : nullptr;
}

}  // namespace opbridge
