// The PMI2 backend (srun --mpi=pmi2). Compiled only when libpmi2 was found at build time;
// libpmi2 itself is dlopened when a store connects (pmi2_api.hpp).
//
// Limits and choices:
//   - PMI2 values are short strings (PMI2_MAX_VALLEN 1024, keys PMI2_MAX_KEYLEN 64): values are
//     base64url-encoded and split across keys (pmi2_codec.hpp); a 4 KiB value costs 6 keys.
//   - PMI2 commits at the fence: commit() has nothing to do.
//   - PMI2_KVS_Fence has no timeout: a dead peer makes Slurm end the step instead. get() does
//     not wait: after the fence a missing key is an error.
//   - PMI2_Init may run once per process and reads PMI_FD etc. from the real environment.
#include "backends.hpp"
#include "pmi2_codec.hpp"

#ifdef TOPOLAUNCH_HAVE_PMI2
#include "pmi2_api.hpp"

namespace topolaunch::wireup::detail {
namespace {

std::string pmi2_error(std::string_view what, int rc) {
  return "wireup pmi2: " + std::string(what) + " failed with PMI2 error " + std::to_string(rc);
}

class Pmi2Store final : public KvStore {
 public:
  static Result<std::unique_ptr<KvStore>> connect() {
    const auto& pmi2 = pmi2_api();
    if (!pmi2) {
      return make_error("wireup pmi2: " + pmi2.error().message +
                        "; or use srun --mpi=pmix, or the tcp store (TOPOLAUNCH_WIREUP=tcp)");
    }
    auto store = std::unique_ptr<Pmi2Store>(new Pmi2Store(*pmi2));
    int spawned = 0, appnum = 0;
    if (int rc = pmi2->init(&spawned, &store->size_, &store->rank_, &appnum); rc != PMI2_SUCCESS) {
      return make_error(pmi2_error("PMI2_Init", rc) +
                        " (is this process started by srun --mpi=pmi2?)");
    }
    store->initialized_ = true;
    char jobid[256] = {};
    if (int rc = pmi2->job_get_id(jobid, sizeof jobid); rc != PMI2_SUCCESS) {
      return make_error(pmi2_error("PMI2_Job_GetId", rc));
    }
    store->jobid_ = jobid;
    return std::unique_ptr<KvStore>(std::move(store));
  }

  ~Pmi2Store() override {
    if (initialized_) pmi2_.finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "pmi2"; }

  using KvStore::put;
  Status put(std::string_view key, std::span<const std::byte> value) override {
    auto entries = pmi2::split_value(key, value, PMI2_MAX_KEYLEN - 1, pmi2::kMaxValueChars);
    if (!entries) return entries.error();
    for (const auto& entry : *entries) {
      if (int rc = pmi2_.kvs_put(entry.key.c_str(), entry.value.c_str()); rc != PMI2_SUCCESS) {
        return make_error(pmi2_error("PMI2_KVS_Put('" + entry.key + "')", rc));
      }
    }
    return ok_status();
  }

  Status commit() override { return ok_status(); }

  Status fence(milliseconds) override {
    if (int rc = pmi2_.kvs_fence(); rc != PMI2_SUCCESS)
      return make_error(pmi2_error("PMI2_KVS_Fence", rc));
    return ok_status();
  }

  Result<Bytes> get(std::string_view key, milliseconds) override {
    auto head = get_text(std::string(key));
    if (!head) return head.error();
    return pmi2::join_value(key, *head,
                            [this](const std::string& chunk) { return get_text(chunk); });
  }

 private:
  explicit Pmi2Store(const Pmi2Api& pmi2) : pmi2_(pmi2) {}

  Result<std::string> get_text(const std::string& key) {
    char value[PMI2_MAX_VALLEN + 1] = {};
    int length = 0;
    int rc =
        pmi2_.kvs_get(jobid_.c_str(), PMI2_ID_NULL, key.c_str(), value, sizeof value - 1, &length);
    if (rc != PMI2_SUCCESS) {
      return make_error(pmi2_error("PMI2_KVS_Get('" + key + "')", rc) +
                        " (was it put, and did every rank fence since?)");
    }
    return std::string(value);
  }

  const Pmi2Api& pmi2_;
  int rank_ = 0;
  int size_ = 0;
  std::string jobid_;
  bool initialized_ = false;
};

}  // namespace

Result<std::unique_ptr<KvStore>> connect_pmi2(const Environment&, milliseconds) {
  return Pmi2Store::connect();
}

}  // namespace topolaunch::wireup::detail

#else

namespace topolaunch::wireup::detail {
Result<std::unique_ptr<KvStore>> connect_pmi2(const Environment&, milliseconds) {
  return make_error(
      "wireup pmi2: this topolaunch was built without PMI2 (libpmi2-0-dev was missing at build "
      "time); "
      "use srun --mpi=pmix, or the tcp store (TOPOLAUNCH_WIREUP=tcp)");
}
}  // namespace topolaunch::wireup::detail

#endif
