#include "topolaunch/common/shared_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

namespace topolaunch {

std::string library_path(const char* variable, const char* soname) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? value : soname;
}

Result<SharedLibrary> SharedLibrary::open(const char* variable, const char* soname) {
  std::string path = library_path(variable, soname);
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    if (path != soname)
      return make_error(fmt::format("cannot load {} ({}), which ${} names: unset it to load {}",
                                    path, why != nullptr ? why : "dlopen failed", variable, soname),
                        2);
    return make_error(fmt::format("cannot load {} ({}): install it, or set ${} to its path", path,
                                  why != nullptr ? why : "dlopen failed", variable),
                      2);
  }
  return SharedLibrary(handle, std::move(path));
}

void* SharedLibrary::find(const char* symbol) const { return ::dlsym(handle_, symbol); }

Error SharedLibrary::missing(const char* symbol) const {
  return make_error(fmt::format("{} has no {} (too old a release?)", path_, symbol), 2);
}

}  // namespace topolaunch
