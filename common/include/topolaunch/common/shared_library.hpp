// Libraries that only some paths of a program need (UCX, ibverbs, PMIx, PMI2) are dlopened on
// first use instead of linked, so that a process which never touches them does not pay their
// loading at start (~2 ms CPU, ~5 ms elapsed of ~15 ms for an agent with 12 such libraries)
// and a node without them can still run everything else. NVML and the CUDA driver were always
// loaded this way.
#pragma once

#include <string>

#include "topolaunch/common/result.hpp"

namespace topolaunch {

// The file a loader opens: $variable when set and not empty, else `soname`
// (e.g. "TOPOLAUNCH_PMIX_LIBRARY", "libpmix.so.2").
std::string library_path(const char* variable, const char* soname);

// A dlopen()ed library (RTLD_NOW | RTLD_LOCAL) that stays loaded for the rest of the process:
// the libraries loaded this way start threads and register exit handlers (UCX, PMIx) that would
// run unmapped code if the library were closed under them.
class SharedLibrary {
 public:
  // Opens library_path(variable, soname). The error names the file, says dlerror()'s text and
  // the variable that overrides the name.
  static Result<SharedLibrary> open(const char* variable, const char* soname);

  // The address of `symbol`, or nullptr when the library has none.
  void* find(const char* symbol) const;

  // `out` = `symbol` as a function of out's type, or an error naming the symbol and the library.
  template <class Function>
  Status load(Function& out, const char* symbol) const {
    void* address = find(symbol);
    if (address == nullptr) return missing(symbol);
    out = reinterpret_cast<Function>(address);
    return ok_status();
  }

  const std::string& path() const { return path_; }

 private:
  SharedLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  Error missing(const char* symbol) const;

  void* handle_;
  std::string path_;
};

}  // namespace topolaunch
