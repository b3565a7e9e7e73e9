// mine::scaled_shift: the node of a torch.autograd.Function without symbolic (ScaledShift in
// tests/test_functions.py; its non-tensor arguments are the attributes alpha, dims, squash):
//   y = x * alpha + bias (numpy broadcasting); y = y.sum(dims, keepdim) + y; tanh(y) if squash.
// dims as torch.sum takes them: negative from the end, each at most once, none: every dim.
#include <algorithm>
#include <cmath>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

// Broadcast shape of a and b (numpy rules), or an error naming both.
Status broadcast(const TensorView& a, const TensorView& b, std::vector<int64_t>* out) {
  const size_t rank = std::max(a.shape.size(), b.shape.size());
  out->assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.shape.size() ? 1 : a.shape[i - (rank - a.shape.size())];
    const int64_t db = i < rank - b.shape.size() ? 1 : b.shape[i - (rank - b.shape.size())];
    if (da != db && da != 1 && db != 1)
      return Fail("inputs 'x' ", shape_str(a.shape), " and 'bias' ", shape_str(b.shape), " do not broadcast");
    (*out)[i] = da == 1 ? db : da;
  }
  return Status::OK();
}

// Element strides of `t` read at the broadcast `shape` (0 along a broadcast dim).
std::vector<int64_t> strides_in(const TensorView& t, const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 0);
  int64_t stride = 1;
  for (size_t k = t.shape.size(); k-- > 0;) {
    const size_t i = k + (shape.size() - t.shape.size());
    strides[i] = t.shape[k] == 1 ? 0 : stride;
    stride *= t.shape[k];
  }
  return strides;
}

struct ScaledShift {
  float alpha = 1.f;
  std::vector<int64_t> dims;
  int64_t squash = 0;

  static Status Read(const Attributes& attrs, ScaledShift* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("alpha", &self->alpha));
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("dims", &self->dims));
    return attrs.get("squash", &self->squash);
  }

  // Which dims of a rank-`rank` tensor are summed, checked as torch.sum checks them.
  Status reduced(size_t rank, std::vector<char>* summed) const {
    const int64_t r = static_cast<int64_t>(rank);
    summed->assign(rank, dims.empty() ? 1 : 0);
    for (int64_t d : dims) {
      const int64_t k = d < 0 ? d + r : d;
      if (k < 0 || k >= r) return Fail("attribute 'dims' has ", d, ", outside [", -r, ", ", r - 1, "]");
      if ((*summed)[static_cast<size_t>(k)]) return Fail("attribute 'dims' has dim ", d, " twice");
      (*summed)[static_cast<size_t>(k)] = 1;
    }
    return Status::OK();
  }

  template <typename T>
  Status Run(Context& ctx, const TensorView& x, const TensorView& bias) const {
    std::vector<int64_t> shape;
    OPBRIDGE_RETURN_IF_ERROR(broadcast(x, bias, &shape));
    std::vector<char> summed;
    OPBRIDGE_RETURN_IF_ERROR(reduced(shape.size(), &summed));
    const std::vector<int64_t> sx = strides_in(x, shape), sb = strides_in(bias, shape);
    std::vector<int64_t> sr(shape.size(), 0);  // strides into the kept-dims sum
    int64_t sums = 1;
    for (size_t k = shape.size(); k-- > 0;)
      if (!summed[k]) {
        sr[k] = sums;
        sums *= shape[k];
      }
    Span<T> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, shape, &out));
    const T* px = x.span<T>().data;
    const T* pb = bias.span<T>().data;
    std::vector<T> total(static_cast<size_t>(sums), T(0));
    std::vector<int64_t> where(shape.size(), 0), at(out.size > 0 ? static_cast<size_t>(out.size) : 0);
    for (int64_t i = 0; i < out.size; ++i) {
      int64_t ix = 0, ib = 0, ir = 0;
      for (size_t k = 0; k < shape.size(); ++k) {
        ix += where[k] * sx[k];
        ib += where[k] * sb[k];
        ir += where[k] * sr[k];
      }
      out[i] = px[ix] * T(alpha) + pb[ib];
      total[static_cast<size_t>(ir)] += out[i];
      at[static_cast<size_t>(i)] = ir;
      for (size_t k = shape.size(); k-- > 0;) {  // next multi-index, last dim fastest
        if (++where[k] < shape[k]) break;
        where[k] = 0;
      }
    }
    for (int64_t i = 0; i < out.size; ++i) {
      const T y = out[i] + total[static_cast<size_t>(at[static_cast<size_t>(i)])];
      out[i] = squash ? std::tanh(y) : y;
    }
    return Status::OK();
  }

  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    const TensorView& bias = ctx.input(1);
    if (bias.dtype != x.dtype)
      return Fail("input 'bias' must have the dtype of 'x' (", dtype_name(x.dtype), "), got ", dtype_name(bias.dtype));
    if (x.dtype == DType::kFloat) return Run<float>(ctx, x, bias);
    if (x.dtype == DType::kDouble) return Run<double>(ctx, x, bias);
    return Fail("input 'x' must be float32 or float64, got ", dtype_name(x.dtype));
  }
};

}  // namespace

extern const KernelDef kernel_mine_op_scaled_shift = make_kernel<ScaledShift>();

}  // namespace opbridge
