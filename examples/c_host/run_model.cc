// run_model: run an exported ONNX model with opbridge's custom ops through ONNX Runtime's C API.
// No Python, no ONNX Runtime headers (the declarations are ort_kernels/include/host/ort_host_decl.h).
//
//   g++ -std=c++17 -O2 -I ort_kernels/include examples/c_host/run_model.cc -o run_model -ldl
//   ./run_model path/to/libonnxruntime.so.1.x.y dist/libopbridge_ort.so demo.onnx demo.inputs.bin
//
// INPUTS comes from examples/c_host/write_inputs.py (an .npz in a plain binary layout, see
// read_inputs). Each output is printed as two lines: "output NAME DTYPE [d0,d1,...]", then its
// values. Any failure prints why (ONNX Runtime's own message where there is one) and exits 1.
#include <dlfcn.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "host/ort_host_decl.h"

namespace {

const OrtHostApi* api = nullptr;

[[noreturn]] void die(const std::string& what, const std::string& why) {
  std::fprintf(stderr, "run_model: %s: %s\n", what.c_str(), why.c_str());
  std::exit(1);
}

void check(OrtStatus* status, const std::string& what) {
  if (status == nullptr) return;
  std::string message = api->GetErrorMessage(status);
  api->ReleaseStatus(status);
  die(what, message);
}

struct Input {
  std::string name;
  int32_t type = 0;  // ONNX element type
  std::vector<int64_t> dims;
  std::vector<unsigned char> data;
};

// Little-endian: "OPBIN001", uint32 count, then per input: uint32 name length, name, int32 ONNX
// element type, uint32 rank, int64 dims[rank], uint64 byte count, the bytes (C order).
std::vector<Input> read_inputs(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) die(path, std::strerror(errno));
  const char* bad = "truncated or not an input file (write one with examples/c_host/write_inputs.py)";
  long size = std::fseek(f, 0, SEEK_END) == 0 ? std::ftell(f) : -1;
  if (size < 0 || std::fseek(f, 0, SEEK_SET) != 0) die(path, bad);
  auto fits = [&](uint64_t n) { if (n > static_cast<uint64_t>(size)) die(path, bad); };  // before allocating
  auto read = [&](void* out, uint64_t n) { fits(n); if (n > 0 && std::fread(out, 1, n, f) != n) die(path, bad); };
  char magic[8];
  uint32_t count = 0;
  read(magic, sizeof magic);
  if (std::memcmp(magic, "OPBIN001", 8) != 0) die(path, bad);
  read(&count, 4);
  fits(uint64_t{count} * 20);  // each input takes at least 20 bytes
  std::vector<Input> inputs(count);
  for (Input& in : inputs) {
    uint32_t name_len = 0, rank = 0;
    uint64_t nbytes = 0;
    read(&name_len, 4);
    fits(name_len);
    in.name.resize(name_len);
    read(&in.name[0], name_len);
    read(&in.type, 4);
    read(&rank, 4);
    fits(uint64_t{rank} * 8);
    in.dims.resize(rank);
    read(in.dims.data(), uint64_t{rank} * 8);
    read(&nbytes, 8);
    fits(nbytes);
    in.data.resize(nbytes);
    read(in.data.data(), nbytes);
  }
  std::fclose(f);
  return inputs;
}

void print_output(const char* name, OrtValue* value) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ONNXTensorElementDataType type;
  size_t rank = 0, count = 0;
  check(api->GetTensorTypeAndShape(value, &info), name);
  check(api->GetTensorElementType(info, &type), name);
  check(api->GetDimensionsCount(info, &rank), name);
  std::vector<int64_t> dims(rank);
  check(api->GetDimensions(info, dims.data(), rank), name);
  check(api->GetTensorShapeElementCount(info, &count), name);
  api->ReleaseTensorTypeAndShapeInfo(info);
  static const char* names[] = {"undefined", "float32", "uint8", "int8", "uint16", "int16", "int32", "int64",
                                "string", "bool", "float16", "float64"};
  std::printf("output %s %s [", name, type < 12 ? names[type] : "other");
  for (size_t i = 0; i < rank; ++i) std::printf(i ? ",%lld" : "%lld", static_cast<long long>(dims[i]));
  std::printf("]\n");
  void* data = nullptr;
  if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) check(api->GetTensorMutableData(value, &data), name);
  for (size_t i = 0; i < count; ++i) {
    const char* sep = i ? " " : "";
    switch (type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: std::printf("%s%.9g", sep, static_cast<float*>(data)[i]); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: std::printf("%s%.17g", sep, static_cast<double*>(data)[i]); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: std::printf("%s%d", sep, static_cast<int32_t*>(data)[i]); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
        std::printf("%s%lld", sep, static_cast<long long>(static_cast<int64_t*>(data)[i]));
        break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: std::printf("%s%d", sep, static_cast<int8_t*>(data)[i]); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: std::printf("%s%d", sep, static_cast<uint8_t*>(data)[i]); break;
      default: std::printf("(values of element type %d not printed)", static_cast<int>(type)); i = count;
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s LIBONNXRUNTIME LIBOPBRIDGE MODEL.onnx INPUTS.bin\n", argv[0]);
    return 2;
  }
  const std::vector<Input> inputs = read_inputs(argv[4]);
  void* ort = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (ort == nullptr) die(argv[1], dlerror());
  auto get_api_base = reinterpret_cast<const OrtApiBase* (*)()>(dlsym(ort, "OrtGetApiBase"));
  if (get_api_base == nullptr) die(argv[1], "no OrtGetApiBase symbol: not an ONNX Runtime library");
  const OrtApiBase* base = get_api_base();
  api = reinterpret_cast<const OrtHostApi*>(base->GetApi(opbridge::kOrtApiVersionRequired));
  if (api == nullptr) die(argv[1], std::string("ONNX Runtime ") + base->GetVersionString() + " lacks C API 17");

  OrtEnv* env = nullptr;
  OrtSessionOptions* options = nullptr;
  OrtSession* session = nullptr;
  OrtMemoryInfo* cpu = nullptr;
  OrtAllocator* allocator = nullptr;
  void* library = nullptr;  // left loaded: the process ends right after the session
  check(api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "run_model", &env), "CreateEnv");
  check(api->CreateSessionOptions(&options), "CreateSessionOptions");
  check(api->RegisterCustomOpsLibrary(options, argv[2], &library), argv[2]);
  check(api->CreateSession(env, argv[3], options, &session), argv[3]);
  check(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu), "CreateCpuMemoryInfo");
  check(api->GetAllocatorWithDefaultOptions(&allocator), "GetAllocatorWithDefaultOptions");

  std::vector<const char*> input_names;
  std::vector<OrtValue*> input_values;
  for (const Input& in : inputs) {
    OrtValue* value = nullptr;
    check(api->CreateTensorWithDataAsOrtValue(cpu, const_cast<unsigned char*>(in.data.data()), in.data.size(),
                                              in.dims.data(), in.dims.size(),
                                              static_cast<ONNXTensorElementDataType>(in.type), &value),
          "input '" + in.name + "'");
    input_names.push_back(in.name.c_str());
    input_values.push_back(value);
  }
  size_t num_outputs = 0;
  check(api->SessionGetOutputCount(session, &num_outputs), "SessionGetOutputCount");
  std::vector<char*> output_names(num_outputs);
  std::vector<OrtValue*> outputs(num_outputs, nullptr);
  for (size_t i = 0; i < num_outputs; ++i) {
    check(api->SessionGetOutputName(session, i, allocator, &output_names[i]), "SessionGetOutputName");
  }
  const auto start = std::chrono::steady_clock::now();
  check(api->Run(session, nullptr, input_names.data(), input_values.data(), input_values.size(),
                 output_names.data(), num_outputs, outputs.data()),
        "Run");
  const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
  for (size_t i = 0; i < num_outputs; ++i) print_output(output_names[i], outputs[i]);
  std::fprintf(stderr, "run_model: ran %s in %.2f ms\n", argv[3], took.count());

  for (size_t i = 0; i < num_outputs; ++i) {
    api->ReleaseValue(outputs[i]);
    check(api->AllocatorFree(allocator, output_names[i]), "AllocatorFree");
  }
  for (OrtValue* value : input_values) api->ReleaseValue(value);
  api->ReleaseMemoryInfo(cpu);
  api->ReleaseSession(session);
  api->ReleaseSessionOptions(options);
  api->ReleaseEnv(env);
  return 0;
}
