// opbridge's own declaration of the ONNX Runtime C ABI subset it uses (C API version 17).
// See ort_abi.h for why it exists and how the slot indices are checked.
#pragma once

#include <cstddef>
#include <cstdint>

#define ORT_API_CALL  // empty on Linux: the platform's C calling convention

extern "C" {

struct OrtStatus;
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtValue;
struct OrtTensorTypeAndShapeInfo;
struct OrtShapeInferContext;
typedef OrtStatus* OrtStatusPtr;

typedef enum OrtErrorCode {
  ORT_OK = 0,
  ORT_FAIL = 1,
  ORT_INVALID_ARGUMENT = 2,
  ORT_NO_SUCHFILE = 3,
  ORT_NO_MODEL = 4,
  ORT_ENGINE_ERROR = 5,
  ORT_RUNTIME_EXCEPTION = 6,
  ORT_INVALID_PROTOBUF = 7,
  ORT_MODEL_LOADED = 8,
  ORT_NOT_IMPLEMENTED = 9,
  ORT_INVALID_GRAPH = 10,
  ORT_EP_FAIL = 11,
} OrtErrorCode;

// Numbered as ONNX TensorProto.DataType for every type opbridge uses (they diverge only past 23).
typedef enum ONNXTensorElementDataType {
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 = 3,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 = 4,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16 = 5,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING = 8,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE = 11,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32 = 12,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64 = 13,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64 = 14,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128 = 15,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 = 16,
} ONNXTensorElementDataType;

typedef enum OrtCustomOpInputOutputCharacteristic {
  INPUT_OUTPUT_REQUIRED = 0,
  INPUT_OUTPUT_OPTIONAL = 1,
  INPUT_OUTPUT_VARIADIC = 2,
} OrtCustomOpInputOutputCharacteristic;

typedef enum OrtMemType {
  OrtMemTypeCPUInput = -2,
  OrtMemTypeCPUOutput = -1,
  OrtMemTypeCPU = OrtMemTypeCPUOutput,
  OrtMemTypeDefault = 0,
} OrtMemType;

// OrtApi: only the members opbridge calls are named; `_N_M` pads unused slots N..M.
struct OrtApi {
  OrtStatus*(ORT_API_CALL* CreateStatus)(OrtErrorCode code, const char* msg);           // 0
  OrtErrorCode(ORT_API_CALL* GetErrorCode)(const OrtStatus* status);                     // 1
  const char*(ORT_API_CALL* GetErrorMessage)(const OrtStatus* status);                   // 2
  void* _3_25[23];
  OrtStatus*(ORT_API_CALL* CreateCustomOpDomain)(const char* domain, OrtCustomOpDomain** out);  // 26
  OrtStatus*(ORT_API_CALL* CustomOpDomain_Add)(OrtCustomOpDomain* domain, const struct OrtCustomOp* op);  // 27
  OrtStatus*(ORT_API_CALL* AddCustomOpDomain)(OrtSessionOptions* options, OrtCustomOpDomain* domain);  // 28
  void* _29_50[22];
  OrtStatus*(ORT_API_CALL* GetTensorMutableData)(OrtValue* value, void** out);           // 51
  void* _52_59[8];
  OrtStatus*(ORT_API_CALL* GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info,
                                                 ONNXTensorElementDataType* out);        // 60
  OrtStatus*(ORT_API_CALL* GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);  // 61
  OrtStatus*(ORT_API_CALL* GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dim_values,
                                          size_t dim_values_length);                     // 62
  void* _63_64[2];
  OrtStatus*(ORT_API_CALL* GetTensorTypeAndShape)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out);  // 65
  void* _66_84[19];
  OrtStatus*(ORT_API_CALL* KernelInfoGetAttribute_float)(const OrtKernelInfo* info, const char* name,
                                                         float* out);                    // 85
  OrtStatus*(ORT_API_CALL* KernelInfoGetAttribute_int64)(const OrtKernelInfo* info, const char* name,
                                                         int64_t* out);                  // 86
  OrtStatus*(ORT_API_CALL* KernelInfoGetAttribute_string)(const OrtKernelInfo* info, const char* name,
                                                          char* out, size_t* size);      // 87
  OrtStatus*(ORT_API_CALL* KernelContext_GetInputCount)(const OrtKernelContext* context, size_t* out);  // 88
  OrtStatus*(ORT_API_CALL* KernelContext_GetOutputCount)(const OrtKernelContext* context, size_t* out);  // 89
  OrtStatus*(ORT_API_CALL* KernelContext_GetInput)(const OrtKernelContext* context, size_t index,
                                                   const OrtValue** out);                // 90
  OrtStatus*(ORT_API_CALL* KernelContext_GetOutput)(OrtKernelContext* context, size_t index,
                                                    const int64_t* dim_values, size_t dim_count,
                                                    OrtValue** out);                     // 91
  void* _92_92[1];
  void(ORT_API_CALL* ReleaseStatus)(OrtStatus* input);                                   // 93
  void* _94_98[5];
  void(ORT_API_CALL* ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* input);   // 99
  void* _100_161[62];
  OrtStatus*(ORT_API_CALL* KernelInfoGetAttributeArray_float)(const OrtKernelInfo* info, const char* name,
                                                              float* out, size_t* size);  // 162
  OrtStatus*(ORT_API_CALL* KernelInfoGetAttributeArray_int64)(const OrtKernelInfo* info, const char* name,
                                                              int64_t* out, size_t* size);  // 163
  void* _164_273[110];
  OrtStatus*(ORT_API_CALL* KernelContext_ParallelFor)(const OrtKernelContext* context, void (*fn)(void*, size_t),
                                                      size_t total, size_t num_batch, void* usr_data);  // 274
};

struct OrtApiBase {
  const OrtApi*(ORT_API_CALL* GetApi)(uint32_t version);
  const char*(ORT_API_CALL* GetVersionString)(void);
};

struct OrtCustomOp {
  uint32_t version;
  void*(ORT_API_CALL* CreateKernel)(const struct OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
  const char*(ORT_API_CALL* GetName)(const struct OrtCustomOp* op);
  const char*(ORT_API_CALL* GetExecutionProviderType)(const struct OrtCustomOp* op);
  ONNXTensorElementDataType(ORT_API_CALL* GetInputType)(const struct OrtCustomOp* op, size_t index);
  size_t(ORT_API_CALL* GetInputTypeCount)(const struct OrtCustomOp* op);
  ONNXTensorElementDataType(ORT_API_CALL* GetOutputType)(const struct OrtCustomOp* op, size_t index);
  size_t(ORT_API_CALL* GetOutputTypeCount)(const struct OrtCustomOp* op);
  void(ORT_API_CALL* KernelCompute)(void* op_kernel, OrtKernelContext* context);
  void(ORT_API_CALL* KernelDestroy)(void* op_kernel);
  OrtCustomOpInputOutputCharacteristic(ORT_API_CALL* GetInputCharacteristic)(const struct OrtCustomOp* op,
                                                                             size_t index);
  OrtCustomOpInputOutputCharacteristic(ORT_API_CALL* GetOutputCharacteristic)(const struct OrtCustomOp* op,
                                                                              size_t index);
  OrtMemType(ORT_API_CALL* GetInputMemoryType)(const struct OrtCustomOp* op, size_t index);
  int(ORT_API_CALL* GetVariadicInputMinArity)(const struct OrtCustomOp* op);
  int(ORT_API_CALL* GetVariadicInputHomogeneity)(const struct OrtCustomOp* op);
  int(ORT_API_CALL* GetVariadicOutputMinArity)(const struct OrtCustomOp* op);
  int(ORT_API_CALL* GetVariadicOutputHomogeneity)(const struct OrtCustomOp* op);
  OrtStatusPtr(ORT_API_CALL* CreateKernelV2)(const struct OrtCustomOp* op, const OrtApi* api,
                                             const OrtKernelInfo* info, void** kernel);
  OrtStatusPtr(ORT_API_CALL* KernelComputeV2)(void* op_kernel, OrtKernelContext* context);
  OrtStatusPtr(ORT_API_CALL* InferOutputShapeFn)(const struct OrtCustomOp* op, OrtShapeInferContext* ctx);
  int(ORT_API_CALL* GetStartVersion)(const struct OrtCustomOp* op);
  int(ORT_API_CALL* GetEndVersion)(const struct OrtCustomOp* op);
  size_t(ORT_API_CALL* GetMayInplace)(int** input_index, int** output_index);
  void(ORT_API_CALL* ReleaseMayInplace)(int* input_index, int* output_index);
  size_t(ORT_API_CALL* GetAliasMap)(int** input_index, int** output_index);
  void(ORT_API_CALL* ReleaseAliasMap)(int* input_index, int* output_index);
};

}  // extern "C"

#define OPBRIDGE_SLOT(member, index) \
  static_assert(offsetof(OrtApi, member) == (index) * sizeof(void*), #member " must be OrtApi slot " #index)
OPBRIDGE_SLOT(CreateStatus, 0);
OPBRIDGE_SLOT(GetErrorMessage, 2);
OPBRIDGE_SLOT(CreateCustomOpDomain, 26);
OPBRIDGE_SLOT(CustomOpDomain_Add, 27);
OPBRIDGE_SLOT(AddCustomOpDomain, 28);
OPBRIDGE_SLOT(GetTensorMutableData, 51);
OPBRIDGE_SLOT(GetTensorElementType, 60);
OPBRIDGE_SLOT(GetDimensions, 62);
OPBRIDGE_SLOT(GetTensorTypeAndShape, 65);
OPBRIDGE_SLOT(KernelInfoGetAttribute_float, 85);
OPBRIDGE_SLOT(KernelInfoGetAttribute_string, 87);
OPBRIDGE_SLOT(KernelContext_GetInputCount, 88);
OPBRIDGE_SLOT(KernelContext_GetOutput, 91);
OPBRIDGE_SLOT(ReleaseStatus, 93);
OPBRIDGE_SLOT(ReleaseTensorTypeAndShapeInfo, 99);
OPBRIDGE_SLOT(KernelInfoGetAttributeArray_float, 162);
OPBRIDGE_SLOT(KernelInfoGetAttributeArray_int64, 163);
OPBRIDGE_SLOT(KernelContext_ParallelFor, 274);
static_assert(sizeof(OrtApiBase) == 2 * sizeof(void*), "OrtApiBase is two function pointers");
static_assert(offsetof(OrtCustomOp, CreateKernelV2) == 17 * sizeof(void*), "OrtCustomOp::CreateKernelV2 slot");
static_assert(offsetof(OrtCustomOp, GetEndVersion) == 21 * sizeof(void*), "OrtCustomOp::GetEndVersion slot");
static_assert(sizeof(OrtCustomOp) == 26 * sizeof(void*), "OrtCustomOp is version + 25 function pointers");
#undef OPBRIDGE_SLOT

