// The op table the registration unit walks; generated from the Python registry at build time.
#pragma once

#include <cstddef>

#include "opbridge_kernel.h"

namespace opbridge {

struct OpEntry {
  const char* domain;
  int version;  // the ONNX opset version of the op's domain
  const char* name;
  const KernelDef* kernel;
  int num_inputs;
  int input_types[16];     // DType numbers
  unsigned optional_mask;  // bit i set: input i is optional (Tensor? in the schema) and may be omitted
  int num_outputs;
  int output_types[8];
};

extern const OpEntry kOpTable[];
extern const size_t kOpTableSize;

}  // namespace opbridge
