#include "ucx_context.hpp"

#include <fmt/format.h>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>

namespace topolaunch::rdma::detail {

std::string status_text(ucs_status_t s) {
  const auto& ucx = ucx_api();
  return ucx ? ucx->status_string(s) : fmt::format("UCX status {}", static_cast<int>(s));
}

std::string ep_lanes(ucp_ep_h ep) {
  const auto& ucx = ucx_api();
  if (!ep || !ucx) return "";
  char* buf = nullptr;
  std::size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return "";
  ucx->ep_print_info(ep, f);
  std::fclose(f);
  std::string text(buf, len);
  std::free(buf);
  // lines like "lane[0]:  0:tcp/lo.0 md[0] ..." or "1:posix/memory.0 ..."
  std::set<std::string> found;
  static const std::regex lane(R"(lane\[\d+\]:\s+\d+:([a-z0-9_]+)/([A-Za-z0-9_\-]+))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), lane); it != std::sregex_iterator();
       ++it)
    found.insert((*it)[1].str() + "/" + (*it)[2].str());
  std::string out;
  for (const auto& s : found) out += (out.empty() ? "" : ",") + s;
  return out;
}

Result<UcxWorker> open_ucx_worker(const UcxSettings& settings, const std::string& name) {
  const auto& loaded = ucx_api();
  if (!loaded) return make_error("ucx: " + loaded.error().message, loaded.error().exit_code);
  const UcxApi& ucx = *loaded;
  const std::string& t = settings.transports;
  const char* env_tls = std::getenv("UCX_TLS");
  const std::string tls = t.empty() ? (env_tls ? env_tls : "all") : t;
  const bool shm = tls.find("shm") != std::string::npos || tls.find("sm") != std::string::npos ||
                   tls.find("posix") != std::string::npos || tls.find("all") != std::string::npos;
  if (shm) setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucx.config_read(nullptr, nullptr, &config); s != UCS_OK)
    return make_error("ucx: reading the UCX configuration failed: " + status_text(s), 1);
  struct ConfigRelease {
    const UcxApi& ucx;
    ucp_config_t* c;
    ~ConfigRelease() { ucx.config_release(c); }
  } release{ucx, config};
  auto modify = [&](const char* key, const std::string& value) -> Status {
    if (ucs_status_t s = ucx.config_modify(config, key, value.c_str()); s != UCS_OK)
      return make_error(fmt::format("ucx: UCX_{}={} rejected: {}", key, value, status_text(s)), 2);
    return ok_status();
  };
  if (!settings.transports.empty())
    if (auto st = modify("TLS", settings.transports); !st) return st.error();
  if (!settings.net_devices.empty())
    if (auto st = modify("NET_DEVICES", settings.net_devices); !st) return st.error();
  // Memory UCX allocates for us (ucp_mem_map ALLOCATE) comes from the first method of
  // UCX_ALLOC_PRIO, sysv by default. sysv has no peer-failure handling, so our endpoints have no
  // sysv lane and a put into sysv memory becomes an active message the target must apply
  // (0.8 us per 8 B ping-pong, ~0.07 GB/s for ucx_perftest -e on a loaded host). posix memory is
  // mapped by the posix lane: the put is a store (0.09 us). So posix first, unless the user chose.
  if (shm && !std::getenv("UCX_ALLOC_PRIO"))
    if (auto st = modify("ALLOC_PRIO", kPosixFirstAllocPrio); !st) return st.error();
  if (!std::getenv("UCX_KEEPALIVE_INTERVAL"))
    if (auto st = modify("KEEPALIVE_INTERVAL", fmt::format("{}ms", settings.keepalive.count()));
        !st)
      return st.error();

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | (settings.rma ? UCP_FEATURE_RMA : 0);
  params.name = name.c_str();
  ucp_context_h raw_context = nullptr;
  // ucp_init() is ucp.h's inline call of this with the API version the header describes.
  if (ucs_status_t s =
          ucx.init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &raw_context);
      s != UCS_OK)
    return make_error(fmt::format("ucx: ucp_init failed with UCX_TLS={} UCX_NET_DEVICES={}: {}",
                                  settings.transports.empty() ? "(default)" : settings.transports,
                                  settings.net_devices.empty() ? "(default)" : settings.net_devices,
                                  status_text(s)),
                      2);
  UcxWorker out;
  out.ucx = &ucx;
  out.context = ContextPtr(raw_context, ContextDeleter{&ucx});

  ucp_context_attr_t cattr{};
  cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucx.context_query(raw_context, &cattr) == UCS_OK) out.memory_types = cattr.memory_types;

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h raw_worker = nullptr;
  if (ucs_status_t s = ucx.worker_create(raw_context, &wparams, &raw_worker); s != UCS_OK)
    return make_error("ucx: ucp_worker_create failed: " + status_text(s), 1);
  out.worker = WorkerPtr(raw_worker, WorkerDeleter{&ucx});

  ucp_address_t* addr = nullptr;
  std::size_t addr_len = 0;
  if (ucs_status_t s = ucx.worker_get_address(raw_worker, &addr, &addr_len); s != UCS_OK)
    return make_error("ucx: ucp_worker_get_address failed: " + status_text(s), 1);
  out.address.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucx.worker_release_address(raw_worker, addr);
  return out;
}

}  // namespace topolaunch::rdma::detail
