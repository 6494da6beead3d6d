// topolaunch-rdma-probe [--sysfs DIR] [--no-cuda] [--register-gpu]: prints this node's RDMA
// inventory (devices, ports, GIDs, peermem, CUDA dma-buf/GPUDirect capability) as JSON, and
// the registration method the selector predicts for each GPU. With --register-gpu (and a CUDA
// driver) it also exports a dma-buf fd for a cuMemAlloc'ed buffer, the first half of the
// dma-buf registration path, to show the prediction holds. Exit 0, or 2 on a bad sysfs tree.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "topolaunch/rdma/probe.hpp"

using namespace topolaunch::rdma;

namespace {

// The driver calls for the dma-buf export check (no cuda.h on build hosts).
nlohmann::json try_dmabuf_export() {
  nlohmann::json j;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return {{"attempted", false}, {"why", "no libcuda.so.1"}};
  using Init = int (*)(unsigned);
  using DeviceGet = int (*)(int*, int);
  using CtxCreate = int (*)(void**, unsigned, int);
  using MemAlloc = int (*)(unsigned long long*, std::size_t);
  using MemFree = int (*)(unsigned long long);
  using GetHandle = int (*)(void*, unsigned long long, std::size_t, int, unsigned long long);
  auto init = reinterpret_cast<Init>(dlsym(h, "cuInit"));
  auto dev_get = reinterpret_cast<DeviceGet>(dlsym(h, "cuDeviceGet"));
  auto ctx_create = reinterpret_cast<CtxCreate>(dlsym(h, "cuCtxCreate_v2"));
  auto alloc = reinterpret_cast<MemAlloc>(dlsym(h, "cuMemAlloc_v2"));
  auto mem_free = reinterpret_cast<MemFree>(dlsym(h, "cuMemFree_v2"));
  auto get_handle = reinterpret_cast<GetHandle>(dlsym(h, "cuMemGetHandleForAddressRange"));
  if (!init || !dev_get || !ctx_create || !alloc || !mem_free || !get_handle)
    return {{"attempted", false}, {"why", "driver lacks cuMemGetHandleForAddressRange"}};
  int dev = 0;
  void* ctx = nullptr;
  unsigned long long ptr = 0;
  const std::size_t bytes = std::size_t{64} << 20;
  if (init(0) != 0 || dev_get(&dev, 0) != 0 || ctx_create(&ctx, 0, dev) != 0 ||
      alloc(&ptr, bytes) != 0)
    return {{"attempted", false}, {"why", "cuInit/cuCtxCreate/cuMemAlloc failed"}};
  int fd = -1;
  const int rc_pcie = get_handle(&fd, ptr, bytes, 1, 1);  // MAPPING_TYPE_PCIE
  int rc_plain = -1;
  if (rc_pcie != 0) rc_plain = get_handle(&fd, ptr, bytes, 1, 0);
  j["attempted"] = true;
  j["bytes"] = bytes;
  j["result_mapping_pcie"] = rc_pcie;
  j["result_flags_0"] = rc_plain;
  j["fd"] = fd;
  if (fd >= 0) {
    char link[256] = {};
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    if (readlink(path.c_str(), link, sizeof link - 1) > 0) j["fd_target"] = link;
    close(fd);
  }
  mem_free(ptr);
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sysfs = "/sys";
  bool cuda = true, register_gpu = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sysfs" && i + 1 < argc)
      sysfs = argv[++i];
    else if (a == "--no-cuda")
      cuda = false;
    else if (a == "--register-gpu")
      register_gpu = true;
    else {
      std::fprintf(stderr, "topolaunch-rdma-probe: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  auto inv = probe_node(sysfs, cuda);
  if (!inv) {
    std::fprintf(stderr, "topolaunch-rdma-probe: %s\n", inv.error().message.c_str());
    return 2;
  }
  auto j = nlohmann::json::parse(to_json(*inv));
  // What the selector would do for each GPU's memory (NIC-independent part of the rule).
  j["gpu_registration_prediction"] = nlohmann::json::array();
  for (const auto& g : inv->cuda.gpus) {
    std::string method = "host staging";
    std::string why;
    if (!g.gpudirect_rdma)
      why = "GPU reports no GPUDirect RDMA";
    else if (g.dma_buf)
      method = "dma-buf";
    else if (inv->peermem)
      method = "peermem";
    else
      why = "no dma-buf and no nvidia_peermem";
    if (inv->devices.empty())
      why += std::string(why.empty() ? "" : "; ") + "no RDMA NIC on this node";
    j["gpu_registration_prediction"].push_back(
        {{"gpu", g.cuda_index}, {"method", method}, {"note", why}});
  }
  if (register_gpu) j["dmabuf_export"] = try_dmabuf_export();
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}
