// The ONNX Runtime C API as a host program sees it: create an environment and a session, load a
// custom-op library, run, read the outputs (C API version 17, like ort_abi_decl.h).
//
// This header is for hosts only (examples/c_host/run_model.cc). It lives in a subfolder so the
// kernel library never compiles it and its cache key (a hash of ort_kernels/include/*.h) stays
// as it is. OrtHostApi is the same OrtApi table as ort_abi_decl.h's, with the slots a host calls
// named and the rest padded; every named slot is checked by static_assert, and the slots both
// views name are checked to sit at the same offset. With -DOPBRIDGE_OFFICIAL_ORT_HEADERS (and the
// official onnxruntime_c_api.h on the include path) OrtHostApi is simply the official OrtApi.
#pragma once

#include "../ort_abi.h"

#ifdef OPBRIDGE_OFFICIAL_ORT_HEADERS
typedef OrtApi OrtHostApi;
#else

extern "C" {

struct OrtEnv;
struct OrtSession;
struct OrtRunOptions;
struct OrtMemoryInfo;
struct OrtAllocator;

typedef enum OrtLoggingLevel {
  ORT_LOGGING_LEVEL_VERBOSE = 0,
  ORT_LOGGING_LEVEL_INFO = 1,
  ORT_LOGGING_LEVEL_WARNING = 2,
  ORT_LOGGING_LEVEL_ERROR = 3,
  ORT_LOGGING_LEVEL_FATAL = 4,
} OrtLoggingLevel;

typedef enum OrtAllocatorType {
  OrtInvalidAllocator = -1,
  OrtDeviceAllocator = 0,
  OrtArenaAllocator = 1,
} OrtAllocatorType;

// OrtApi seen from a host: `_N_M` pads unused slots N..M.
struct OrtHostApi {
  void* _0_1[2];
  const char*(ORT_API_CALL* GetErrorMessage)(const OrtStatus* status);                   // 2
  OrtStatus*(ORT_API_CALL* CreateEnv)(OrtLoggingLevel log_severity_level, const char* logid,
                                      OrtEnv** out);                                     // 3
  void* _4_6[3];
  OrtStatus*(ORT_API_CALL* CreateSession)(const OrtEnv* env, const char* model_path,
                                          const OrtSessionOptions* options, OrtSession** out);  // 7
  void* _8_8[1];
  OrtStatus*(ORT_API_CALL* Run)(OrtSession* session, const OrtRunOptions* run_options,
                                const char* const* input_names, const OrtValue* const* inputs, size_t input_len,
                                const char* const* output_names, size_t output_names_len,
                                OrtValue** outputs);                                     // 9
  OrtStatus*(ORT_API_CALL* CreateSessionOptions)(OrtSessionOptions** options);           // 10
  void* _11_28[18];
  // Loads the library and calls its RegisterCustomOps(options, api_base); the handle may be
  // dlclose'd once every session using `options` is released.
  OrtStatus*(ORT_API_CALL* RegisterCustomOpsLibrary)(OrtSessionOptions* options, const char* library_path,
                                                     void** library_handle);             // 29
  OrtStatus*(ORT_API_CALL* SessionGetInputCount)(const OrtSession* session, size_t* out);   // 30
  OrtStatus*(ORT_API_CALL* SessionGetOutputCount)(const OrtSession* session, size_t* out);  // 31
  void* _32_35[4];
  OrtStatus*(ORT_API_CALL* SessionGetInputName)(const OrtSession* session, size_t index, OrtAllocator* allocator,
                                                char** value);                           // 36
  OrtStatus*(ORT_API_CALL* SessionGetOutputName)(const OrtSession* session, size_t index, OrtAllocator* allocator,
                                                 char** value);                          // 37
  void* _38_48[11];
  OrtStatus*(ORT_API_CALL* CreateTensorWithDataAsOrtValue)(const OrtMemoryInfo* info, void* p_data,
                                                           size_t p_data_len, const int64_t* shape, size_t shape_len,
                                                           ONNXTensorElementDataType type, OrtValue** out);  // 49
  void* _50_50[1];
  OrtStatus*(ORT_API_CALL* GetTensorMutableData)(OrtValue* value, void** out);           // 51
  void* _52_59[8];
  OrtStatus*(ORT_API_CALL* GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info,
                                                 ONNXTensorElementDataType* out);        // 60
  OrtStatus*(ORT_API_CALL* GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);  // 61
  OrtStatus*(ORT_API_CALL* GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dim_values,
                                          size_t dim_values_length);                     // 62
  void* _63_63[1];
  OrtStatus*(ORT_API_CALL* GetTensorShapeElementCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);  // 64
  OrtStatus*(ORT_API_CALL* GetTensorTypeAndShape)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out);  // 65
  void* _66_68[3];
  OrtStatus*(ORT_API_CALL* CreateCpuMemoryInfo)(OrtAllocatorType type, OrtMemType mem_type,
                                                OrtMemoryInfo** out);                    // 69
  void* _70_75[6];
  OrtStatus*(ORT_API_CALL* AllocatorFree)(OrtAllocator* allocator, void* p);             // 76
  void* _77_77[1];
  OrtStatus*(ORT_API_CALL* GetAllocatorWithDefaultOptions)(OrtAllocator** out);          // 78
  void* _79_91[13];
  void(ORT_API_CALL* ReleaseEnv)(OrtEnv* input);                                         // 92
  void(ORT_API_CALL* ReleaseStatus)(OrtStatus* input);                                   // 93
  void(ORT_API_CALL* ReleaseMemoryInfo)(OrtMemoryInfo* input);                           // 94
  void(ORT_API_CALL* ReleaseSession)(OrtSession* input);                                 // 95
  void(ORT_API_CALL* ReleaseValue)(OrtValue* input);                                     // 96
  void* _97_98[2];
  void(ORT_API_CALL* ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* input);   // 99
  void(ORT_API_CALL* ReleaseSessionOptions)(OrtSessionOptions* input);                   // 100
};

}  // extern "C"

#define OPBRIDGE_HOST_SLOT(member, index) \
  static_assert(offsetof(OrtHostApi, member) == (index) * sizeof(void*), #member " must be OrtApi slot " #index)
OPBRIDGE_HOST_SLOT(GetErrorMessage, 2);
OPBRIDGE_HOST_SLOT(CreateEnv, 3);
OPBRIDGE_HOST_SLOT(CreateSession, 7);
OPBRIDGE_HOST_SLOT(Run, 9);
OPBRIDGE_HOST_SLOT(CreateSessionOptions, 10);
OPBRIDGE_HOST_SLOT(RegisterCustomOpsLibrary, 29);
OPBRIDGE_HOST_SLOT(SessionGetInputCount, 30);
OPBRIDGE_HOST_SLOT(SessionGetOutputCount, 31);
OPBRIDGE_HOST_SLOT(SessionGetInputName, 36);
OPBRIDGE_HOST_SLOT(SessionGetOutputName, 37);
OPBRIDGE_HOST_SLOT(CreateTensorWithDataAsOrtValue, 49);
OPBRIDGE_HOST_SLOT(GetTensorMutableData, 51);
OPBRIDGE_HOST_SLOT(GetTensorElementType, 60);
OPBRIDGE_HOST_SLOT(GetDimensionsCount, 61);
OPBRIDGE_HOST_SLOT(GetDimensions, 62);
OPBRIDGE_HOST_SLOT(GetTensorShapeElementCount, 64);
OPBRIDGE_HOST_SLOT(GetTensorTypeAndShape, 65);
OPBRIDGE_HOST_SLOT(CreateCpuMemoryInfo, 69);
OPBRIDGE_HOST_SLOT(AllocatorFree, 76);
OPBRIDGE_HOST_SLOT(GetAllocatorWithDefaultOptions, 78);
OPBRIDGE_HOST_SLOT(ReleaseEnv, 92);
OPBRIDGE_HOST_SLOT(ReleaseStatus, 93);
OPBRIDGE_HOST_SLOT(ReleaseMemoryInfo, 94);
OPBRIDGE_HOST_SLOT(ReleaseSession, 95);
OPBRIDGE_HOST_SLOT(ReleaseValue, 96);
OPBRIDGE_HOST_SLOT(ReleaseTensorTypeAndShapeInfo, 99);
OPBRIDGE_HOST_SLOT(ReleaseSessionOptions, 100);
#undef OPBRIDGE_HOST_SLOT

// The slots the kernel view (OrtApi in ort_abi_decl.h) also names sit at the same place.
#define OPBRIDGE_SAME_SLOT(member) \
  static_assert(offsetof(OrtHostApi, member) == offsetof(OrtApi, member), #member ": host and kernel views differ")
OPBRIDGE_SAME_SLOT(GetErrorMessage);
OPBRIDGE_SAME_SLOT(GetTensorMutableData);
OPBRIDGE_SAME_SLOT(GetTensorElementType);
OPBRIDGE_SAME_SLOT(GetDimensionsCount);
OPBRIDGE_SAME_SLOT(GetDimensions);
OPBRIDGE_SAME_SLOT(GetTensorTypeAndShape);
OPBRIDGE_SAME_SLOT(ReleaseStatus);
OPBRIDGE_SAME_SLOT(ReleaseTensorTypeAndShapeInfo);
#undef OPBRIDGE_SAME_SLOT

#endif  // OPBRIDGE_OFFICIAL_ORT_HEADERS
