// opbridge::numpy_sin (functional form) — returns sin(input), the new value of `output`.
// Mirrors custom_ops/numpy_sin.py; `output`'s old value is not read.
#include <cmath>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

template <typename T>
void numpy_sin(Span<const T> input, Span<T> output) {
  for (int64_t i = 0; i < input.size; ++i) output[i] = std::sin(input[i]);
}

struct NumpySin {
  static Status Read(const Attributes&, NumpySin*) { return Status::OK(); }

  Status Compute(Context& ctx) const {
    const TensorView& input = ctx.input(0);
    const TensorView& output = ctx.input(1);
    if (input.shape != output.shape)
      return Fail("inputs 'input' ", shape_str(input.shape), " and 'output' ", shape_str(output.shape),
                  " must have one shape");
    switch (input.dtype) {
      case DType::kFloat: return run<float>(ctx, input);
      case DType::kDouble: return run<double>(ctx, input);
      default: return Fail("input 'input' has unsupported dtype ", dtype_name(input.dtype));
    }
  }

  template <typename T>
  Status run(Context& ctx, const TensorView& input) const {
    Span<T> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, input.shape, &out));
    numpy_sin(input.span<T>(), out);
    return Status::OK();
  }
};

}  // namespace

extern const KernelDef kernel_opbridge_op_numpy_sin = make_kernel<NumpySin>();

}  // namespace opbridge
