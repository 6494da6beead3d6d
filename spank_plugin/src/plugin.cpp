// Entry points Slurm looks up in spank_topolaunch.so, and the dispatch to one file per context
// (local.cpp: srun/sbatch/salloc; remote.cpp: slurmstepd). Every body runs inside a catch-all:
// an exception must never unwind into Slurm's C code.
#include <fmt/format.h>
#include <slurm/slurm_version.h>

#include <exception>
#include <string_view>
#include <vector>

#include "spank.hpp"

namespace topolaunch::spank {

PluginState& state() {
  static PluginState the_state;
  return the_state;
}

void log_error(const std::string& message) { slurm_error("topolaunch: %s", message.c_str()); }
void log_info(const std::string& message) {
  // Before plugstack.conf is parsed the level is the default (info).
  if (state().site.log_level == LogLevel::error) return;
  slurm_info("topolaunch: %s", message.c_str());
}

void log_debug(const std::string& message) {
  if (state().site.log_level != LogLevel::debug) return;
  slurm_info("topolaunch: %s", message.c_str());
}

namespace {

template <class Body>
int guarded(const char* where, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    log_error(fmt::format("{}: {}", where, e.what()));
  } catch (...) {
    log_error(fmt::format("{}: unexpected error", where));
  }
  return -1;
}

// plugstack.conf arguments, parsed in every context (each process parses them once).
int load_site_config(int ac, char** av) {
  std::vector<std::string_view> args;
  for (int i = 0; i < ac; ++i) args.emplace_back(av[i]);
  auto site = parse_site_config(args);
  if (!site) {
    log_error(site.error().message);
    return -1;
  }
  state().site = *site;
  state().site_ok = true;
  return 0;
}

}  // namespace
}  // namespace topolaunch::spank

namespace tls = topolaunch::spank;

// SPANK_PLUGIN() would make these const objects internal in C++ (spank.md 1.1, C++ gotcha 2).
extern "C" {
__attribute__((visibility("default"))) extern const char plugin_name[] = "topolaunch";
__attribute__((visibility("default"))) extern const char plugin_type[] = "spank";
__attribute__((visibility("default"))) extern const unsigned int plugin_version =
    SLURM_VERSION_NUMBER;
__attribute__((visibility("default"))) extern const unsigned int spank_plugin_version = 1;

__attribute__((visibility("default"))) int slurm_spank_init(spank_t sp, int ac, char** av) {
  return tls::guarded("init", [&] {
    const spank_context_t context = spank_context();
    if (context != S_CTX_LOCAL && context != S_CTX_REMOTE && context != S_CTX_ALLOCATOR) {
      return 0;
    }
    if (tls::load_site_config(ac, av) != 0) {
      // In slurmstepd a -1 here is not shown to the user: remember it for task_init.
      if (context == S_CTX_REMOTE) {
        tls::state().deferred_error = "plugstack.conf is invalid (see the slurmd log)";
      }
      return -1;
    }
    return tls::register_options(sp);
  });
}

__attribute__((visibility("default"))) int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  return tls::guarded("init_post_opt", [&] {
    if (spank_context() == S_CTX_LOCAL) return tls::local_init_post_opt(sp);
    return 0;
  });
}

__attribute__((visibility("default"))) int slurm_spank_user_init(spank_t sp, int ac, char** av) {
  return tls::guarded("user_init", [&] { return tls::remote_user_init(sp, ac, av); });
}

__attribute__((visibility("default"))) int slurm_spank_task_init(spank_t sp, int, char**) {
  return tls::guarded("task_init", [&] { return tls::remote_task_init(sp); });
}

}  // extern "C"
