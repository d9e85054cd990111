// nvrtc.cpp: the emulated NVRTC, the calls core/cudart binds (nvrtc.go). "Compiling" a
// program builds its source for the host with core/cudart/emu's shim header into a kernel
// module (a shared library exporting the module ABI), through the builder core/cudart
// set (resin_emu_set_builder: core/cudart/emu's Build, content-addressed, so a source built
// before is not built again). Macros given as -D options become #defines. For a real
// architecture (sm_XX) the program's CUBIN is the module file itself, an ELF image that the
// emulated cuModuleLoadData loads; for a virtual one (compute_XX) its PTX is the text
// "RESIN-EMU-MODULE <path>", naming the module file.
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "emu_lib.h"

using resin_emu::Cfg;
using resin_emu::Config;
using resin_emu::DeviceRange;
using resin_emu::Mu;
using resin_emu::Op;
using resin_emu::Result;
using resin_emu::SetLaunchError;
using resin_emu::StreamCapturing;
using resin_emu::Submit;

namespace {

enum : int {
  kSuccess = 0,
  kOutOfMemory = 1,
  kProgramCreationFailure = 2,
  kInvalidInput = 3,
  kInvalidProgram = 4,
  kInvalidOption = 5,
  kCompilation = 6,
  kBuiltinOperationFailure = 7,
  kInternalError = 11,
};

struct Program {
  std::string src, name;
  std::string log;
  std::string ptx;                // with its NUL
  std::vector<unsigned char> cubin;
  bool compiled = false;
};

bool readFile(const std::string& path, std::vector<unsigned char>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

}  // namespace

extern "C" int nvrtcVersion(int* major, int* minor) {
  if (!major || !minor) return kInvalidInput;
  *major = 12;
  *minor = 9;
  return kSuccess;
}

extern "C" const char* nvrtcGetErrorString(int r) {
  switch (r) {
    case kSuccess: return "NVRTC_SUCCESS";
    case kOutOfMemory: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case kProgramCreationFailure: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case kInvalidInput: return "NVRTC_ERROR_INVALID_INPUT";
    case kInvalidProgram: return "NVRTC_ERROR_INVALID_PROGRAM";
    case kInvalidOption: return "NVRTC_ERROR_INVALID_OPTION";
    case kCompilation: return "NVRTC_ERROR_COMPILATION";
    case kBuiltinOperationFailure: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
    case kInternalError: return "NVRTC_ERROR_INTERNAL_ERROR";
  }
  return "NVRTC_ERROR unknown";
}

extern "C" int nvrtcCreateProgram(void** prog, const char* src, const char* name, int numHeaders,
                                  const char* const* headers, const char* const* includeNames) {
  (void)headers;
  (void)includeNames;
  if (!prog || !src) return kInvalidInput;
  if (numHeaders != 0) return kInvalidInput;  // Resin inlines its headers
  Program* p = new Program();
  p->src = src;
  p->name = name ? name : "default_program";
  *prog = p;
  return kSuccess;
}

extern "C" int nvrtcDestroyProgram(void** prog) {
  if (!prog || !*prog) return kInvalidProgram;
  delete (Program*)*prog;
  *prog = nullptr;
  return kSuccess;
}

namespace {
// Builder builds a module from a source (core/cudart's callback into core/cudart/emu's
// Build): it writes the module's path, or the compiler's messages, into out and returns 0
// on success.
typedef int (*BuilderFn)(const char* src, const char* name, char* out, long outlen);
BuilderFn g_builder = nullptr;
}  // namespace

extern "C" void resin_emu_set_builder(BuilderFn fn) {
  std::lock_guard<std::mutex> l(Mu());
  g_builder = fn;
}

extern "C" int nvrtcCompileProgram(void* prog, int numOptions, const char* const* options) {
  if (!prog) return kInvalidProgram;
  Program* p = (Program*)prog;
  BuilderFn build;
  {
    std::lock_guard<std::mutex> l(Mu());
    build = g_builder;
  }
  if (!build) {
    p->log = "emulated NVRTC: no module builder (core/cudart sets it when it loads the emulator)";
    return kBuiltinOperationFailure;
  }
  std::string arch, defines;
  for (int i = 0; i < numOptions; i++) {
    std::string o = options[i] ? options[i] : "";
    if (o.rfind("--gpu-architecture=", 0) == 0) {
      arch = o.substr(19);
    } else if (o.rfind("-arch=", 0) == 0) {
      arch = o.substr(6);
    } else if (o.rfind("-D", 0) == 0 || o.rfind("--define-macro=", 0) == 0) {
      std::string d = o[1] == 'D' ? o.substr(2) : o.substr(15);
      size_t eq = d.find('=');
      defines += "#define " + (eq == std::string::npos ? d + " 1" : d.substr(0, eq) + " " + d.substr(eq + 1)) + "\n";
    } else if (o.rfind("-U", 0) == 0) {
      defines += "#undef " + o.substr(2) + "\n";
    } else if (o.rfind("-", 0) != 0) {
      p->log = "emulated NVRTC: option " + o + " is not a flag";
      return kInvalidOption;
    }
    // --std=, -lineinfo, -G, --use_fast_math, ...: nothing to do for the host build.
  }
  if (arch.empty()) arch = "compute_80";
  std::string source = p->src;
  if (!defines.empty()) source = defines + "#line 1 \"" + p->name + "\"\n" + source;
  std::vector<char> out(1 << 20);
  int rc = build(source.c_str(), p->name.c_str(), out.data(), (long)out.size());
  out.back() = 0;
  std::string result(out.data());
  if (rc != 0) {
    p->log = result;
    return kCompilation;
  }
  if (arch.rfind("sm_", 0) == 0) {
    // Another process's cache prune may have deleted the module since it was built (or
    // found): building again writes it back.
    if ((!readFile(result, &p->cubin) || p->cubin.empty()) &&
        build(source.c_str(), p->name.c_str(), out.data(), (long)out.size()) == 0) {
      out.back() = 0;
      result = out.data();
      readFile(result, &p->cubin);
    }
    if (p->cubin.empty()) {
      p->log = "emulated NVRTC: cannot read the module " + result;
      return kInternalError;
    }
  } else {
    p->ptx = "RESIN-EMU-MODULE " + result + "\n";
    p->ptx.push_back(0);
  }
  p->compiled = true;
  return kSuccess;
}

extern "C" int nvrtcGetProgramLogSize(void* prog, size_t* n) {
  if (!prog || !n) return kInvalidInput;
  *n = ((Program*)prog)->log.size() + 1;
  return kSuccess;
}

extern "C" int nvrtcGetProgramLog(void* prog, char* buf) {
  if (!prog || !buf) return kInvalidInput;
  const std::string& l = ((Program*)prog)->log;
  memcpy(buf, l.c_str(), l.size() + 1);
  return kSuccess;
}

extern "C" int nvrtcGetPTXSize(void* prog, size_t* n) {
  if (!prog || !n) return kInvalidInput;
  Program* p = (Program*)prog;
  if (!p->compiled || p->ptx.empty()) return kInvalidProgram;
  *n = p->ptx.size();
  return kSuccess;
}

extern "C" int nvrtcGetPTX(void* prog, char* buf) {
  if (!prog || !buf) return kInvalidInput;
  Program* p = (Program*)prog;
  if (!p->compiled || p->ptx.empty()) return kInvalidProgram;
  memcpy(buf, p->ptx.data(), p->ptx.size());
  return kSuccess;
}

extern "C" int nvrtcGetCUBINSize(void* prog, size_t* n) {
  if (!prog || !n) return kInvalidInput;
  Program* p = (Program*)prog;
  if (!p->compiled || p->cubin.empty()) return kInvalidProgram;
  *n = p->cubin.size();
  return kSuccess;
}

extern "C" int nvrtcGetCUBIN(void* prog, char* buf) {
  if (!prog || !buf) return kInvalidInput;
  Program* p = (Program*)prog;
  if (!p->compiled || p->cubin.empty()) return kInvalidProgram;
  memcpy(buf, p->cubin.data(), p->cubin.size());
  return kSuccess;
}

extern "C" int nvrtcGetNumSupportedArchs(int* n) {
  if (!n) return kInvalidInput;
  *n = 1;
  return kSuccess;
}

extern "C" int nvrtcGetSupportedArchs(int* archs) {
  if (!archs) return kInvalidInput;
  archs[0] = 80;
  return kSuccess;
}
