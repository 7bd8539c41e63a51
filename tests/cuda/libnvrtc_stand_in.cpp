// A stand-in for NVRTC beside the stand-in CUDA driver (libcuda_stand_in.cpp), so that the kernels
// a process compiles for itself (a session's, a test's) run there too: every call goes on to the
// real NVRTC (`G4C_STAND_IN_NVRTC`, the library's path), and each program created is also built for
// the host, as the host emulator builds it, into `G4C_STAND_IN_NVRTC_BUILDS`, a folder the stand-in
// driver looks for kernels in. The build is `G4C_STAND_IN_CXX` (a compiler and its flags, separated
// by spaces, which include the emulator's header first) of the program's source.
//
// cudarc opens NVRTC as `libnvrtc.so` before its versioned names, so a process with this library
// (named so) first on its library path calls it; g4c itself opens the real one by its path first.
// A program whose host build fails is said on stderr, beginning "libnvrtc stand-in:", and compiled
// all the same: its kernels then have no host build, which the stand-in driver refuses.

#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace {

using nvrtcResult = int;
using nvrtcProgram = void*;

// The real NVRTC, opened once.
void* real() {
  static void* lib = [] {
    const char* path = std::getenv("G4C_STAND_IN_NVRTC");
    void* opened = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!opened) {
      std::fprintf(stderr, "libnvrtc stand-in: cannot open the real NVRTC (G4C_STAND_IN_NVRTC=%s): %s\n",
                   path ? path : "", path ? dlerror() : "unset");
      std::abort();
    }
    return opened;
  }();
  return lib;
}

// The real NVRTC's function `name`, of type `F`.
template <typename F>
F forward(const char* name) {
  void* f = dlsym(real(), name);
  if (!f) {
    std::fprintf(stderr, "libnvrtc stand-in: the real NVRTC has no %s\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

// FNV-1a of `text`, in hex: a program's file name, the same for the same source.
std::string hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char name[17];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
  return name;
}

// Builds `source` for the host into the builds folder, unless a build of it is there already.
// Written under a name of this thread's, then renamed: a build is whole or absent.
void build_for_host(const char* source) {
  const char* dir = std::getenv("G4C_STAND_IN_NVRTC_BUILDS");
  const char* cxx = std::getenv("G4C_STAND_IN_CXX");
  if (!dir || !cxx) {
    std::fprintf(stderr, "libnvrtc stand-in: G4C_STAND_IN_NVRTC_BUILDS and G4C_STAND_IN_CXX must be set\n");
    return;
  }
  const std::string base = std::string(dir) + "/" + hash(source);
  const std::string library = base + ".so";
  if (access(library.c_str(), F_OK) == 0) return;
  const std::string own = base + "." + std::to_string(getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  const std::string cpp = own + ".cpp", built = own + ".so.part", log = own + ".log";
  std::ofstream(cpp) << source;
  const std::string command = std::string(cxx) + " -o '" + built + "' '" + cpp + "' 2>'" + log + "'";
  if (std::system(command.c_str()) != 0 || std::rename(built.c_str(), library.c_str()) != 0) {
    std::fprintf(stderr, "libnvrtc stand-in: the host build of a program failed: %s (its log: %s)\n",
                 command.c_str(), log.c_str());
    return;
  }
  std::remove(cpp.c_str());
  std::remove(log.c_str());
}

}  // namespace

extern "C" {

nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int headers,
                               const char* const* contents, const char* const* names) {
  using F = nvrtcResult (*)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  build_for_host(src);
  return forward<F>("nvrtcCreateProgram")(prog, src, name, headers, contents, names);
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int count, const char* const* options) {
  return forward<nvrtcResult (*)(nvrtcProgram, int, const char* const*)>("nvrtcCompileProgram")(prog, count, options);
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  return forward<nvrtcResult (*)(nvrtcProgram*)>("nvrtcDestroyProgram")(prog);
}

nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t* size) {
  return forward<nvrtcResult (*)(nvrtcProgram, size_t*)>("nvrtcGetPTXSize")(prog, size);
}

nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char* ptx) {
  return forward<nvrtcResult (*)(nvrtcProgram, char*)>("nvrtcGetPTX")(prog, ptx);
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* size) {
  return forward<nvrtcResult (*)(nvrtcProgram, size_t*)>("nvrtcGetProgramLogSize")(prog, size);
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
  return forward<nvrtcResult (*)(nvrtcProgram, char*)>("nvrtcGetProgramLog")(prog, log);
}

nvrtcResult nvrtcVersion(int* major, int* minor) {
  return forward<nvrtcResult (*)(int*, int*)>("nvrtcVersion")(major, minor);
}

const char* nvrtcGetErrorString(nvrtcResult result) {
  return forward<const char* (*)(nvrtcResult)>("nvrtcGetErrorString")(result);
}

}  // extern "C"
