// A stand-in for NVIDIA's CUDA driver (libcuda.so) on a machine without a GPU, so that what only a
// GPU runs of g4c's CUDA backend (runtime/src/backend/cuda/driver.rs: modules from cubins and PTX,
// buffers, queued uploads through the staging region, graphs, programmatic launches, profiling, the
// context bound to each thread) runs in `make test`, through cudarc as on a GPU. The test
// (tests/cuda/stand_in_driver.rs) compiles it to a `libcuda.so` that the g4c it runs finds first.
//
// Kernels run on the host: each is looked up by name in the host builds of the programs
// (`G4C_STAND_IN_KERNELS`, colon-separated libraries or folders of them, looked at again for a
// kernel not yet found: the emulator's builds, whose `g4c_emulate` runs a launch).
// The GPU it pretends to be: `G4C_STAND_IN_CAPABILITY` ("9.0"), `G4C_STAND_IN_SMEM_OPTIN` (bytes),
// `G4C_STAND_IN_SMS`; its driver version is 13.0.
//
// It keeps the driver's rules that g4c must follow, and refuses what breaks them:
// - every call but a few needs a context current on the calling thread;
// - copies and launches are queued on their stream and run when the host waits for it (or for a
//   copy into pageable memory); a queued copy from page-locked memory reads it when it runs, so
//   the host writing those bytes before then is caught; from pageable memory, when it is queued;
// - a launch's arguments are read when it is queued, and each must point into a live allocation;
// - a launch with more than 48 KiB of dynamic shared memory needs its function's opt-in first,
//   and the opt-in at most the GPU's limit;
// - while a stream records a graph, what it records does not run, and waiting for it (or the
//   context), or allocating on the recording thread, is refused and spoils the recording;
// - programmatic dependent launch needs compute capability 9.0;
// - a kernel must be in its module's image (a PTX `.entry`, a cubin's `.nv.info.NAME`), and only
//   its pointer parameters are supported;
// - a kernel's failure is sticky: every later call returns it, as a GPU context's fault does.
// Every refusal is also printed to stderr, beginning "libcuda stand-in:".

#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;

enum : CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
};

constexpr int ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int ATTRIBUTE_MEMORY_CLOCK_RATE = 36;
constexpr int ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37;
constexpr int ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115;
constexpr int FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
constexpr unsigned EVENT_DISABLE_TIMING = 2;
constexpr unsigned DEFAULT_DYNAMIC_SMEM = 48 * 1024;

// The driver API's structs that g4c passes, as cuda.h lays them out.
struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmaticStreamSerializationAllowed;
  } value;
};
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  void* hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};

using Emulate = int (*)(void*, void**, const unsigned long long*, int, unsigned, unsigned, int, unsigned);

struct Function {
  std::string name;
  int params;
  void* kernel;
  Emulate emulate;
  unsigned max_dynamic_smem = DEFAULT_DYNAMIC_SMEM;
};

struct Module {
  // Kernel name: its parameters.
  std::map<std::string, int> entries;
  std::vector<Function*> functions;
};

struct Event {
  unsigned flags;
  bool recorded = false, done = false;
  double at_ms = 0;
};

// One queued or recorded operation.
struct Op {
  enum Kind { HtoD, DtoH, DtoD, Memset, Launch, Record } kind;
  CUdeviceptr device = 0, source = 0;
  void* host = nullptr;
  size_t bytes = 0;
  unsigned char value = 0;
  // A pageable source's bytes, copied when queued; or a page-locked one's as they were when
  // queued (`check_pinned`), to tell whether the host wrote them before the copy ran.
  std::vector<unsigned char> copied;
  bool pageable = false, check_pinned = false;
  Function* function = nullptr;
  unsigned grid = 0, block = 0, smem = 0;
  std::vector<CUdeviceptr> args;
  Event* event = nullptr;
};

struct Graph {
  std::vector<Op> ops;
};

struct Stream {
  std::deque<Op> queue;
  Graph* recording = nullptr;
  bool spoiled = false;
  // The thread recording, whose unsafe calls spoil it (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).
  const void* recorder = nullptr;
};

struct Context {
  int retained = 0;
};

std::recursive_mutex lock;
bool initialized = false;
CUresult sticky = CUDA_SUCCESS;
Context primary;
thread_local Context* current = nullptr;
thread_local char thread_tag;
std::map<CUdeviceptr, size_t> allocations;
std::map<uintptr_t, size_t> pinned;
std::set<const void*> live;
Stream legacy;
std::set<Stream*> streams;
std::vector<void*> libraries;
std::set<std::string> opened;

CUresult refuse(CUresult code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fprintf(stderr, "libcuda stand-in: ");
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  return code;
}

// A fault inside a kernel or a copy as it runs: sticky, as on a GPU.
CUresult fault(CUresult code, const std::string& what) {
  if (sticky == CUDA_SUCCESS) sticky = refuse(code, "%s (sticky from now on)", what.c_str());
  return sticky;
}

int env_int(const char* name, int otherwise) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : otherwise;
}

void capability(int* major, int* minor) {
  const char* v = std::getenv("G4C_STAND_IN_CAPABILITY");
  *major = 9;
  *minor = 0;
  if (v) std::sscanf(v, "%d.%d", major, minor);
}

// What every call on a context checks first.
CUresult ready() {
  if (!initialized) return refuse(CUDA_ERROR_NOT_INITIALIZED, "cuInit was not called");
  if (sticky != CUDA_SUCCESS) return sticky;
  if (current == nullptr) return refuse(CUDA_ERROR_INVALID_CONTEXT, "no context is current on this thread");
  return CUDA_SUCCESS;
}

// Whether one allocation holds the `bytes` bytes from `p`; then `*left` is the bytes from `p` to
// its end.
bool within(CUdeviceptr p, size_t bytes, size_t* left = nullptr) {
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return false;
  --it;
  if (p < it->first || p + bytes > it->first + it->second) return false;
  if (left) *left = it->first + it->second - p;
  return true;
}

bool is_pinned(const void* host, size_t bytes) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(host);
  auto it = pinned.upper_bound(p);
  if (it == pinned.begin()) return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second;
}

Stream* stream_of(void* handle) { return handle ? static_cast<Stream*>(handle) : &legacy; }

// Whether this thread records a graph on some stream: what it may not do meanwhile spoils it.
Stream* recording_by_this_thread() {
  for (Stream* s : streams)
    if (s->recording && s->recorder == &thread_tag) return s;
  if (legacy.recording && legacy.recorder == &thread_tag) return &legacy;
  return nullptr;
}

CUresult unsafe_while_recording(const char* call) {
  if (Stream* s = recording_by_this_thread()) {
    s->spoiled = true;
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "%s while this thread records a graph", call);
  }
  return CUDA_SUCCESS;
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

CUresult run(Op& op) {
  switch (op.kind) {
    case Op::HtoD: {
      const void* from = op.pageable ? op.copied.data() : op.host;
      if (op.check_pinned && std::memcmp(op.host, op.copied.data(), op.bytes) != 0)
        return fault(CUDA_ERROR_LAUNCH_FAILED,
                     "the host wrote page-locked memory that a queued copy had not yet read (it reads it when it runs)");
      std::memcpy(reinterpret_cast<void*>(op.device), from, op.bytes);
      return CUDA_SUCCESS;
    }
    case Op::DtoH:
      std::memcpy(op.host, reinterpret_cast<const void*>(op.source), op.bytes);
      return CUDA_SUCCESS;
    case Op::DtoD:
      std::memmove(reinterpret_cast<void*>(op.device), reinterpret_cast<const void*>(op.source), op.bytes);
      return CUDA_SUCCESS;
    case Op::Memset:
      std::memset(reinterpret_cast<void*>(op.device), op.value, op.bytes);
      return CUDA_SUCCESS;
    case Op::Record:
      op.event->done = true;
      op.event->at_ms = now_ms();
      return CUDA_SUCCESS;
    case Op::Launch: {
      std::vector<void*> pointers;
      std::vector<unsigned long long> bytes;
      for (CUdeviceptr a : op.args) {
        size_t left = 0;
        // An argument may be freed between its queueing and its run.
        if (!within(a, 0, &left))
          return fault(CUDA_ERROR_ILLEGAL_ADDRESS, "kernel " + op.function->name + " ran on an argument no longer allocated");
        pointers.push_back(reinterpret_cast<void*>(a));
        bytes.push_back(left);
      }
      // Every launch as one whose threads synchronize: the emulator's slower way, right for both.
      const int rc = op.function->emulate(op.function->kernel, pointers.data(), bytes.data(), int(pointers.size()),
                                          op.grid, op.block, 1, op.smem);
      if (rc != 0)
        return fault(CUDA_ERROR_LAUNCH_FAILED,
                     "kernel " + op.function->name + " failed on the host emulator (g4c_emulate returned " +
                         std::to_string(rc) + ")");
      return CUDA_SUCCESS;
    }
  }
  return CUDA_SUCCESS;
}

// Runs what is queued on `s`, in order.
CUresult drain(Stream* s) {
  while (!s->queue.empty()) {
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    if (sticky != CUDA_SUCCESS) continue;
    run(op);
  }
  return sticky;
}

// Queues `op` on `s`, or records it while `s` records a graph.
CUresult enqueue(Stream* s, Op op) {
  if (s->recording) {
    s->recording->ops.push_back(std::move(op));
    return CUDA_SUCCESS;
  }
  s->queue.push_back(std::move(op));
  return CUDA_SUCCESS;
}

// Waiting for `s`: refused while it records (which spoils the recording).
CUresult wait_for(Stream* s, const char* call) {
  if (s->recording) {
    s->spoiled = true;
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "%s on a stream recording a graph", call);
  }
  return drain(s);
}

// Opens the host builds `G4C_STAND_IN_KERNELS` names that are not open yet: each entry a library,
// or a folder whose libraries (`*.so`, in any subfolder) are taken as they appear there.
void open_libraries() {
  const char* list = std::getenv("G4C_STAND_IN_KERNELS");
  const std::string all = list ? list : "";
  std::vector<std::string> paths;
  for (size_t start = 0; start <= all.size();) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    const std::filesystem::path entry = all.substr(start, end - start);
    start = end + 1;
    std::error_code ignored;
    if (std::filesystem::is_directory(entry, ignored)) {
      for (const auto& f : std::filesystem::recursive_directory_iterator(entry, ignored))
        if (f.path().extension() == ".so") paths.push_back(f.path().string());
    } else if (!entry.empty()) {
      paths.push_back(entry.string());
    }
  }
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) {
    if (opened.count(path)) continue;
    opened.insert(path);
    if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))
      libraries.push_back(lib);
    else
      refuse(CUDA_SUCCESS, "cannot open %s: %s", path.c_str(), dlerror());
  }
}

// A cubin's kernels and their parameters: per kernel its `.nv.info.NAME` section, whose
// EIATTR_KPARAM_INFO records (format EIFMT_SVAL 0x04, attribute 0x17) are one per parameter.
bool cubin_entries(const unsigned char* image, std::map<std::string, int>* entries) {
  const auto* header = reinterpret_cast<const Elf64_Ehdr*>(image);
  if (header->e_ident[EI_CLASS] != ELFCLASS64 || header->e_shentsize != sizeof(Elf64_Shdr)) return false;
  const auto* sections = reinterpret_cast<const Elf64_Shdr*>(image + header->e_shoff);
  const char* names = reinterpret_cast<const char*>(image + sections[header->e_shstrndx].sh_offset);
  const std::string prefix = ".nv.info.";
  for (int i = 0; i < header->e_shnum; ++i) {
    const std::string name = names + sections[i].sh_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const unsigned char* records = image + sections[i].sh_offset;
    int params = 0;
    for (size_t at = 0; at + 4 <= sections[i].sh_size;) {
      const unsigned format = records[at], attribute = records[at + 1];
      const unsigned size = records[at + 2] | (records[at + 3] << 8);
      if (format == 0x04 && attribute == 0x17) ++params;
      at += format == 0x04 ? 4 + size : 4;
    }
    (*entries)[name.substr(prefix.size())] = params;
  }
  return true;
}

// A PTX text's kernels and their parameters (`.entry NAME(` then `.param` declarations up to the
// closing parenthesis); -1 where one is not a 64-bit pointer.
std::map<std::string, int> ptx_entries(const std::string& ptx) {
  std::map<std::string, int> entries;
  for (size_t at = ptx.find(".entry "); at != std::string::npos; at = ptx.find(".entry ", at + 1)) {
    const size_t open = ptx.find('(', at), close = ptx.find(')', open);
    if (open == std::string::npos || close == std::string::npos) break;
    std::string name = ptx.substr(at + 7, open - at - 7);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t' || name.back() == '\n')) name.pop_back();
    int params = 0;
    const std::string list = ptx.substr(open, close - open);
    for (size_t p = list.find(".param"); p != std::string::npos; p = list.find(".param", p + 1)) {
      params = list.compare(p, 11, ".param .u64") == 0 && params >= 0 ? params + 1 : -1;
    }
    entries[name] = params;
  }
  return entries;
}

}  // namespace

extern "C" {

CUresult cuGetErrorName(CUresult error, const char** out) {
  static std::map<CUresult, std::string> names;
  std::lock_guard<std::recursive_mutex> guard(lock);
  auto& name = names[error];
  if (name.empty()) name = "CUDA_ERROR_" + std::to_string(error) + " (the libcuda stand-in's)";
  *out = name.c_str();
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char** out) { return cuGetErrorName(error, out); }

CUresult cuInit(unsigned flags) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (flags != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuInit flags %u", flags);
  initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (!initialized) return refuse(CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGetCount before cuInit");
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(int* device, int ordinal) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (!initialized) return refuse(CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGet before cuInit");
  if (ordinal != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "GPU %d: the stand-in has one", ordinal);
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int length, int device) {
  std::snprintf(name, length, "libcuda stand-in (device %d)", device);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, int device) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (!initialized) return refuse(CUDA_ERROR_NOT_INITIALIZED, "cuDeviceGetAttribute before cuInit");
  if (device != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "device %d", device);
  int major, minor;
  capability(&major, &minor);
  switch (attribute) {
    case ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = major; return CUDA_SUCCESS;
    case ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = minor; return CUDA_SUCCESS;
    case ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = env_int("G4C_STAND_IN_SMS", 1); return CUDA_SUCCESS;
    case ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = env_int("G4C_STAND_IN_SMEM_OPTIN", 49152); return CUDA_SUCCESS;
    case ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *value = 0; return CUDA_SUCCESS;
    // 1 GHz on a 64-bit bus: 16 GB/s, which says nothing about a GPU.
    case ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 1000000; return CUDA_SUCCESS;
    case ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 64; return CUDA_SUCCESS;
  }
  return refuse(CUDA_ERROR_NOT_SUPPORTED, "device attribute %d is not known to the stand-in", attribute);
}

CUresult cuDevicePrimaryCtxRetain(void** context, int device) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (!initialized) return refuse(CUDA_ERROR_NOT_INITIALIZED, "cuDevicePrimaryCtxRetain before cuInit");
  if (device != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "device %d", device);
  ++primary.retained;
  *context = &primary;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(int device) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (primary.retained == 0) return refuse(CUDA_ERROR_INVALID_CONTEXT, "releasing a primary context not retained");
  --primary.retained;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(void* context) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (context != nullptr && context != &primary) return refuse(CUDA_ERROR_INVALID_CONTEXT, "an unknown context");
  if (context != nullptr && primary.retained == 0) return refuse(CUDA_ERROR_INVALID_CONTEXT, "a released context");
  current = static_cast<Context*>(context);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(void** context) {
  *context = current;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize() {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  for (Stream* s : streams)
    if (s->recording) {
      s->spoiled = true;
      return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuCtxSynchronize while a stream records a graph");
    }
  for (Stream* s : streams) drain(s);
  return drain(&legacy);
}

CUresult cuStreamCreate(void** stream, unsigned flags) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto* s = new Stream();
  streams.insert(s);
  *stream = s;
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  auto* s = static_cast<Stream*>(stream);
  if (!streams.count(s)) return refuse(CUDA_ERROR_INVALID_HANDLE, "destroying an unknown stream");
  // Its work still runs, as a GPU's does after the stream is destroyed.
  drain(s);
  streams.erase(s);
  delete s->recording;
  delete s;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  return wait_for(stream_of(stream), "cuStreamSynchronize");
}

CUresult cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!live.count(event)) return refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent on an unknown event");
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(void* stream, int mode) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  Stream* s = stream_of(stream);
  if (s == &legacy) return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "recording the legacy stream");
  if (s->recording) return refuse(CUDA_ERROR_INVALID_VALUE, "a stream already recording");
  constexpr int THREAD_LOCAL = 1;
  if (mode != THREAD_LOCAL) return refuse(CUDA_ERROR_NOT_SUPPORTED, "capture mode %d: the stand-in keeps the thread-local mode's rules only", mode);
  // Work queued before the recording is not part of it; it runs in order before what the graph
  // later runs, as the stream's.
  s->recording = new Graph();
  s->spoiled = false;
  s->recorder = &thread_tag;
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(void* stream, void** graph) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  Stream* s = stream_of(stream);
  if (!s->recording) return refuse(CUDA_ERROR_INVALID_VALUE, "ending a recording never begun");
  if (s->recorder != &thread_tag) return refuse(CUDA_ERROR_INVALID_VALUE, "ending another thread's recording");
  Graph* g = s->recording;
  s->recording = nullptr;
  *graph = nullptr;
  if (s->spoiled) {
    delete g;
    return refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "the recording was spoiled by a call it does not allow");
  }
  live.insert(g);
  *graph = g;
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(void* stream, int* status) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  Stream* s = stream_of(stream);
  *status = s->recording ? (s->spoiled ? 2 : 1) : 0;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (CUresult r = unsafe_while_recording("cuMemAlloc")) return r;
  if (bytes == 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 0 bytes");
  void* memory = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!memory) return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc of %zu bytes", bytes);
  // Not zeroed, as a GPU's is not: what reads it before writing sees these bytes.
  std::memset(memory, 0xa5, bytes);
  *p = reinterpret_cast<CUdeviceptr>(memory);
  allocations[*p] = bytes;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (CUresult r = unsafe_while_recording("cuMemFree")) return r;
  if (!allocations.count(p)) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree of %#llx, not an allocation", p);
  // Freeing waits for the work before it.
  for (Stream* s : streams) drain(s);
  drain(&legacy);
  allocations.erase(p);
  std::free(reinterpret_cast<void*>(p));
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (CUresult r = unsafe_while_recording("cuMemHostAlloc")) return r;
  if (bytes == 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc of 0 bytes");
  *p = std::malloc(bytes);
  pinned[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void* p) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (CUresult r = unsafe_while_recording("cuMemFreeHost")) return r;
  if (!pinned.count(reinterpret_cast<uintptr_t>(p)))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost of memory cuMemHostAlloc did not give");
  for (Stream* s : streams) drain(s);
  drain(&legacy);
  pinned.erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char value, size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!within(p, bytes)) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemsetD8Async of %zu bytes outside an allocation", bytes);
  Op op{Op::Memset};
  op.device = p;
  op.bytes = bytes;
  op.value = value;
  return enqueue(stream_of(stream), std::move(op));
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr to, const void* from, size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!within(to, bytes)) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoDAsync of %zu bytes outside an allocation", bytes);
  Stream* s = stream_of(stream);
  Op op{Op::HtoD};
  op.device = to;
  op.host = const_cast<void*>(from);
  op.bytes = bytes;
  const auto* source = static_cast<const unsigned char*>(from);
  op.pageable = !is_pinned(from, bytes);
  // A recorded copy reads the page-locked memory each time the graph runs.
  op.check_pinned = !op.pageable && !s->recording;
  if (op.pageable || op.check_pinned) op.copied.assign(source, source + bytes);
  if (op.pageable) {
    if (s->recording) {
      s->spoiled = true;
      return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a copy from pageable memory recorded into a graph");
    }
    // From pageable memory the driver waits for the stream, then stages the bytes.
    if (CUresult r = drain(s)) return r;
  }
  return enqueue(s, std::move(op));
}

CUresult cuMemcpyDtoHAsync_v2(void* to, CUdeviceptr from, size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!within(from, bytes)) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoHAsync of %zu bytes outside an allocation", bytes);
  Stream* s = stream_of(stream);
  Op op{Op::DtoH};
  op.host = to;
  op.source = from;
  op.bytes = bytes;
  const bool into_pageable = !is_pinned(to, bytes);
  if (into_pageable && s->recording) {
    s->spoiled = true;
    return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a copy into pageable memory recorded into a graph");
  }
  if (CUresult r = enqueue(s, std::move(op))) return r;
  // Into pageable memory the call returns once the copy is done.
  return into_pageable ? drain(s) : CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr to, CUdeviceptr from, size_t bytes, void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!within(to, bytes) || !within(from, bytes))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoDAsync of %zu bytes outside an allocation", bytes);
  Op op{Op::DtoD};
  op.device = to;
  op.source = from;
  op.bytes = bytes;
  return enqueue(stream_of(stream), std::move(op));
}

CUresult cuModuleLoadData(void** module, const void* image) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (CUresult r = unsafe_while_recording("cuModuleLoadData")) return r;
  auto* m = new Module();
  const auto* bytes = static_cast<const unsigned char*>(image);
  if (std::memcmp(bytes, ELFMAG, SELFMAG) == 0) {
    if (!cubin_entries(bytes, &m->entries)) {
      delete m;
      return refuse(CUDA_ERROR_INVALID_IMAGE, "a cubin that is not a 64-bit ELF");
    }
  } else {
    const std::string ptx(static_cast<const char*>(image));
    const size_t target = ptx.find(".target sm_");
    if (ptx.find(".version ") == std::string::npos || target == std::string::npos) {
      delete m;
      return refuse(CUDA_ERROR_INVALID_IMAGE, "an image that is neither a cubin nor PTX");
    }
    int major, minor;
    capability(&major, &minor);
    const int needs = std::atoi(ptx.c_str() + target + 11);
    if (needs > major * 10 + minor) {
      delete m;
      return refuse(CUDA_ERROR_NO_BINARY_FOR_GPU, "PTX for sm_%d on a GPU of sm_%d%d", needs, major, minor);
    }
    m->entries = ptx_entries(ptx);
  }
  if (m->entries.empty()) {
    delete m;
    return refuse(CUDA_ERROR_INVALID_IMAGE, "an image without kernels");
  }
  live.insert(m);
  *module = m;
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(void** module, const void* image, unsigned, int*, void**) {
  return cuModuleLoadData(module, image);
}

CUresult cuModuleUnload(void* module) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  auto* m = static_cast<Module*>(module);
  if (!live.count(m)) return refuse(CUDA_ERROR_INVALID_HANDLE, "unloading an unknown module");
  for (Function* f : m->functions) {
    live.erase(f);
    delete f;
  }
  live.erase(m);
  delete m;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto* m = static_cast<Module*>(module);
  if (!live.count(m)) return refuse(CUDA_ERROR_INVALID_HANDLE, "an unknown module");
  auto entry = m->entries.find(name);
  if (entry == m->entries.end()) return refuse(CUDA_ERROR_NOT_FOUND, "kernel %s is not in its module", name);
  if (entry->second < 0) return refuse(CUDA_ERROR_NOT_SUPPORTED, "kernel %s takes a parameter that is not a pointer", name);
  open_libraries();
  for (void* lib : libraries) {
    void* kernel = dlsym(lib, name);
    auto emulate = reinterpret_cast<Emulate>(dlsym(lib, "g4c_emulate"));
    if (!kernel || !emulate) continue;
    auto* f = new Function{name, entry->second, kernel, emulate};
    m->functions.push_back(f);
    live.insert(f);
    *function = f;
    return CUDA_SUCCESS;
  }
  return refuse(CUDA_ERROR_NOT_FOUND, "kernel %s has no host build in G4C_STAND_IN_KERNELS", name);
}

CUresult cuFuncSetAttribute(void* function, int attribute, int value) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto* f = static_cast<Function*>(function);
  if (!live.count(f)) return refuse(CUDA_ERROR_INVALID_HANDLE, "an unknown function");
  if (attribute != FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
    return refuse(CUDA_ERROR_NOT_SUPPORTED, "function attribute %d is not known to the stand-in", attribute);
  const int most = env_int("G4C_STAND_IN_SMEM_OPTIN", 49152);
  if (value < 0 || value > most)
    return refuse(CUDA_ERROR_INVALID_VALUE, "kernel %s: %d bytes of dynamic shared memory, and the GPU allows %d",
                  f->name.c_str(), value, most);
  f->max_dynamic_smem = unsigned(value);
  return CUDA_SUCCESS;
}

// A launch of `f` queued (or recorded) on `stream`, its arguments read now.
static CUresult launch(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, void* stream, void** params, void** extra) {
  if (CUresult r = ready()) return r;
  auto* f = static_cast<Function*>(function);
  if (!live.count(f)) return refuse(CUDA_ERROR_INVALID_HANDLE, "launching an unknown function");
  if (extra != nullptr) return refuse(CUDA_ERROR_NOT_SUPPORTED, "kernel %s: `extra` launch parameters", f->name.c_str());
  if (gy != 1 || gz != 1 || by != 1 || bz != 1)
    return refuse(CUDA_ERROR_NOT_SUPPORTED, "kernel %s: the stand-in runs one-dimensional launches only", f->name.c_str());
  if (gx == 0 || bx == 0 || bx > 1024)
    return refuse(CUDA_ERROR_INVALID_VALUE, "kernel %s: %u blocks of %u threads", f->name.c_str(), gx, bx);
  if (smem > f->max_dynamic_smem)
    return refuse(CUDA_ERROR_INVALID_VALUE,
                  "kernel %s: %u bytes of dynamic shared memory, past the %u its function allows (opt in with "
                  "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                  f->name.c_str(), smem, f->max_dynamic_smem);
  Op op{Op::Launch};
  op.function = f;
  op.grid = gx;
  op.block = bx;
  op.smem = smem;
  for (int i = 0; i < f->params; ++i) {
    const CUdeviceptr a = *static_cast<const CUdeviceptr*>(params[i]);
    if (!within(a, 0))
      return refuse(CUDA_ERROR_INVALID_VALUE, "kernel %s: argument %d (%#llx) is in no allocation", f->name.c_str(), i, a);
    op.args.push_back(a);
  }
  return enqueue(stream_of(stream), std::move(op));
}

CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void* stream, void** params, void** extra) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  return launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, void* f, void** params, void** extra) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  int major, minor;
  capability(&major, &minor);
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    if (a.id != LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
      return refuse(CUDA_ERROR_NOT_SUPPORTED, "launch attribute %d is not known to the stand-in", a.id);
    if (major < 9) return refuse(CUDA_ERROR_NOT_SUPPORTED, "programmatic dependent launch on sm_%d%d", major, minor);
  }
  return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                config->blockDimZ, config->sharedMemBytes, config->hStream, params, extra);
}

CUresult cuEventCreate(void** event, unsigned flags) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto* e = new Event{flags};
  live.insert(e);
  *event = e;
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(void* event) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (!live.count(event)) return refuse(CUDA_ERROR_INVALID_HANDLE, "destroying an unknown event");
  live.erase(event);
  // A queued record may still name it: kept, as a destroyed event's pending work completes.
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(void* event, void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto* e = static_cast<Event*>(event);
  if (!live.count(e)) return refuse(CUDA_ERROR_INVALID_HANDLE, "recording an unknown event");
  Stream* s = stream_of(stream);
  if (s->recording) return refuse(CUDA_ERROR_NOT_SUPPORTED, "the stand-in records no events into graphs");
  e->recorded = true;
  e->done = false;
  Op op{Op::Record};
  op.event = e;
  return enqueue(s, std::move(op));
}

CUresult cuEventSynchronize(void* event) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto* e = static_cast<Event*>(event);
  if (!live.count(e)) return refuse(CUDA_ERROR_INVALID_HANDLE, "waiting for an unknown event");
  for (Stream* s : streams)
    if (!s->recording) drain(s);
  drain(&legacy);
  return sticky;
}

CUresult cuEventQuery(void* event) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto* e = static_cast<Event*>(event);
  if (!live.count(e)) return refuse(CUDA_ERROR_INVALID_HANDLE, "querying an unknown event");
  return !e->recorded || e->done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  auto *a = static_cast<Event*>(start), *b = static_cast<Event*>(end);
  if (!live.count(a) || !live.count(b)) return refuse(CUDA_ERROR_INVALID_HANDLE, "timing unknown events");
  if ((a->flags | b->flags) & EVENT_DISABLE_TIMING) return refuse(CUDA_ERROR_INVALID_HANDLE, "timing events made without timing");
  if (!a->done || !b->done) return refuse(CUDA_ERROR_NOT_READY, "timing events not yet reached");
  *ms = float(b->at_ms - a->at_ms);
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime_v2(float* ms, void* start, void* end) { return cuEventElapsedTime(ms, start, end); }

CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!live.count(graph)) return refuse(CUDA_ERROR_INVALID_HANDLE, "instantiating an unknown graph");
  auto* g = new Graph(*static_cast<Graph*>(graph));
  live.insert(g);
  *exec = g;
  return CUDA_SUCCESS;
}

CUresult cuGraphUpload(void* exec, void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!live.count(exec)) return refuse(CUDA_ERROR_INVALID_HANDLE, "uploading an unknown graph");
  return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(void* exec, void* stream) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (CUresult r = ready()) return r;
  if (!live.count(exec)) return refuse(CUDA_ERROR_INVALID_HANDLE, "launching an unknown graph");
  Stream* s = stream_of(stream);
  if (s->recording) return refuse(CUDA_ERROR_NOT_SUPPORTED, "the stand-in records no graph launches into graphs");
  for (const Op& op : static_cast<Graph*>(exec)->ops) s->queue.push_back(op);
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(void* exec) {
  std::lock_guard<std::recursive_mutex> guard(lock);
  if (!live.count(exec)) return refuse(CUDA_ERROR_INVALID_HANDLE, "destroying an unknown graph");
  live.erase(exec);
  delete static_cast<Graph*>(exec);
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(void* graph) { return cuGraphExecDestroy(graph); }

}  // extern "C"
