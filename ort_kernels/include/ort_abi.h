// The ONNX Runtime C ABI, as far as opbridge uses it.
//
// No package reachable from this project ships onnxruntime_c_api.h, so the subset used here is
// declared from the public C API reference: OrtApi is an append-only table of function
// pointers, so each used member sits at a fixed index (checked below with static_assert), and
// unused slots are padding. Written against C API version 17 (ONNX Runtime 1.17): the lowest
// that has OrtCustomOp::CreateKernelV2/KernelComputeV2 (16, errors returned as status),
// GetStartVersion/GetEndVersion (17) and KernelContext_ParallelFor (17). Newer runtimes serve
// version 17 unchanged through OrtApiBase::GetApi(17).
//
// Set OPBRIDGE_ORT_INCLUDE_DIR to a folder holding the official onnxruntime_c_api.h and the build
// uses that header instead (-DOPBRIDGE_OFFICIAL_ORT_HEADERS); the code below only names members
// the official header has.
#pragma once

#include <cstddef>
#include <cstdint>

namespace opbridge {
constexpr uint32_t kOrtApiVersionRequired = 17;
constexpr uint32_t kOrtCustomOpVersion = 17;  // OrtCustomOp fields read up to GetEndVersion
}  // namespace opbridge

#ifdef OPBRIDGE_OFFICIAL_ORT_HEADERS
#include <onnxruntime_c_api.h>
#else
#include "ort_abi_decl.h"
#endif
