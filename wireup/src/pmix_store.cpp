// The PMIx backend (srun --mpi=pmix). Compiled only when libpmix was found at build time;
// libpmix itself is dlopened when a store connects (pmix_api.hpp), so other processes never load
// it or the libraries it needs (libevent, libmunge).
//
// Limits and choices:
//   - keys up to PMIX_MAX_KEYLEN (511) chars; values are PMIX_BYTE_OBJECTs (binary-safe).
//   - PMIx data belongs to the process that put it, our keys are job-global. get() first tries
//     the rank a rank_key() names, locally only (PMIX_OPTIONAL: cheap, and a wrong guess such as
//     "ep/<me>/<peer>", put by <me>, just misses), then PMIX_RANK_UNDEF, which makes the PMIx
//     client search every process of the namespace (slower: it grows with ranks and keys).
//   - fence() passes PMIX_COLLECT_DATA so values are on every node afterwards, and PMIX_TIMEOUT
//     (whole seconds, rounded up); a timed-out fence cannot say which ranks were missing.
//   - allgather() is PMIx's own collective: the collecting fence moves every rank's value to
//     every node (Slurm's mpi/pmix does it between the slurmstepd), then each value is read from
//     its owner in the local data store (PMIX_OPTIONAL: no request leaves the process).
//   - The PMIx client library reads its connection info from the real process environment, not
//     from the Environment given to connect_from_env().
#include <algorithm>
#include <charconv>

#include "backends.hpp"

#ifdef TOPOLAUNCH_HAVE_PMIX
#include <cstdlib>
#include <cstring>

#include "pmix_api.hpp"

namespace topolaunch::wireup::detail {
namespace {

std::string pmix_error(const PmixApi& pmix, std::string_view what, pmix_status_t rc) {
  return "wireup pmix: " + std::string(what) + " failed: " + pmix.error_string(rc);
}

// What PMIX_LOAD_PROCID and PMIX_VALUE_CONSTRUCT do, by hand: in PMIx 5 they call the library,
// which is dlopened here (pmix_api.hpp), not linked.
pmix_proc_t proc_of(const char* nspace, pmix_rank_t rank) {
  pmix_proc_t p;
  std::memset(&p, 0, sizeof p);
  std::memcpy(p.nspace, nspace, strnlen(nspace, PMIX_MAX_NSLEN));  // nspace has room for a NUL
  p.rank = rank;
  return p;
}

int timeout_seconds(milliseconds timeout) {
  auto seconds = (timeout.count() + 999) / 1000;
  return static_cast<int>(std::clamp<long long>(seconds, 1, 1 << 30));
}

class PmixStore final : public KvStore {
 public:
  static Result<std::unique_ptr<KvStore>> connect() {
    const auto& pmix = pmix_api();
    if (!pmix) {
      return make_error("wireup pmix: " + pmix.error().message +
                        "; or use srun --mpi=pmi2, or the tcp store (TOPOLAUNCH_WIREUP=tcp)");
    }
    auto store = std::unique_ptr<PmixStore>(new PmixStore(*pmix));
    if (auto rc = pmix->init(&store->self_, nullptr, 0); rc != PMIX_SUCCESS) {
      return make_error(pmix_error(*pmix, "PMIx_Init", rc) +
                        " (is this process started by srun --mpi=pmix?)");
    }
    store->initialized_ = true;
    const pmix_proc_t job = proc_of(store->self_.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t* value = nullptr;
    if (auto rc = pmix->get(&job, PMIX_JOB_SIZE, nullptr, 0, &value); rc != PMIX_SUCCESS) {
      return make_error(pmix_error(*pmix, "PMIx_Get(PMIX_JOB_SIZE)", rc));
    }
    store->size_ = static_cast<int>(value->data.uint32);
    store->release(value);
    return std::unique_ptr<KvStore>(std::move(store));
  }

  ~PmixStore() override {
    if (initialized_) pmix_.finalize(nullptr, 0);
  }

  int rank() const override { return static_cast<int>(self_.rank); }
  int size() const override { return size_; }
  std::string_view backend() const override { return "pmix"; }

  using KvStore::put;
  Status put(std::string_view key, std::span<const std::byte> value) override {
    if (key.empty() || key.size() > PMIX_MAX_KEYLEN) {
      return make_error("wireup pmix: key '" + std::string(key) + "' must have 1.." +
                        std::to_string(PMIX_MAX_KEYLEN) + " chars");
    }
    std::string key_text(key);
    pmix_value_t v{};  // what PMIX_VALUE_CONSTRUCT does (its type set below)
    v.type = PMIX_BYTE_OBJECT;
    // PMIx_Put copies the value; the cast drops a const PMIx never writes through.
    v.data.bo.bytes = const_cast<char*>(reinterpret_cast<const char*>(value.data()));
    v.data.bo.size = value.size();
    auto rc = pmix_.put(PMIX_GLOBAL, key_text.c_str(), &v);
    if (rc != PMIX_SUCCESS)
      return make_error(pmix_error(pmix_, "PMIx_Put('" + key_text + "')", rc));
    return ok_status();
  }

  Status commit() override {
    if (auto rc = pmix_.commit(); rc != PMIX_SUCCESS)
      return make_error(pmix_error(pmix_, "PMIx_Commit", rc));
    return ok_status();
  }

  Status fence(milliseconds timeout) override {
    if (auto r = commit(); !r) return r;
    const pmix_proc_t all = proc_of(self_.nspace, PMIX_RANK_WILDCARD);
    pmix_info_t info[2];
    bool collect = true;
    int seconds = timeout_seconds(timeout);
    load(info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    load(info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    auto rc = pmix_.fence(&all, 1, info, 2);
    destruct(info[0]);
    destruct(info[1]);
    if (rc != PMIX_SUCCESS) {
      return make_error(pmix_error(pmix_,
                                   "PMIx_Fence over " + std::to_string(size_) + " ranks (timeout " +
                                       std::to_string(seconds) + " s)",
                                   rc));
    }
    return ok_status();
  }

  Result<Gathered> allgather(std::string_view name, std::span<const std::byte> mine,
                             milliseconds timeout) override {
    if (auto s = put(rank_key(name, rank()), mine); !s) return s.error();
    if (auto s = fence(timeout); !s) return s.error();
    Gathered values;  // reserved as if every value were the size of this rank's
    values.reserve(static_cast<std::size_t>(size_), static_cast<std::size_t>(size_) * mine.size());
    pmix_info_t info;
    bool local_only = true;
    load(info, PMIX_OPTIONAL, &local_only, PMIX_BOOL);
    for (int r = 0; r < size_; ++r) {
      const std::string key = rank_key(name, r);
      const pmix_proc_t owner = proc_of(self_.nspace, static_cast<pmix_rank_t>(r));
      pmix_value_t* value = nullptr;
      auto rc = pmix_.get(&owner, key.c_str(), &info, 1, &value);
      if (rc != PMIX_SUCCESS) {
        destruct(info);
        return make_error(
            pmix_error(pmix_, "PMIx_Get('" + key + "') after the collecting fence", rc));
      }
      auto bytes = take_bytes(key, value);
      if (!bytes) {
        destruct(info);
        return bytes.error();
      }
      values.push_back(*bytes);
    }
    destruct(info);
    return values;
  }

  Result<Bytes> get(std::string_view key, milliseconds timeout) override {
    std::string key_text(key);
    pmix_value_t* value = nullptr;
    // Fast path: a rank_key() ("name/<rank>") is usually that rank's; PMIX_OPTIONAL looks only in
    // the local data store (filled by the collecting fence) and fails at once if it is not there.
    if (auto guess = guessed_owner(key); guess != PMIX_RANK_UNDEF) {
      const pmix_proc_t owner = proc_of(self_.nspace, guess);
      pmix_info_t info;
      bool local_only = true;
      load(info, PMIX_OPTIONAL, &local_only, PMIX_BOOL);
      auto rc = pmix_.get(&owner, key_text.c_str(), &info, 1, &value);
      destruct(info);
      if (rc != PMIX_SUCCESS) value = nullptr;
    }
    if (value == nullptr) {  // any process of the job may have put it
      const pmix_proc_t anyone = proc_of(self_.nspace, PMIX_RANK_UNDEF);
      pmix_info_t info;
      int seconds = timeout_seconds(timeout);
      load(info, PMIX_TIMEOUT, &seconds, PMIX_INT);
      auto rc = pmix_.get(&anyone, key_text.c_str(), &info, 1, &value);
      destruct(info);
      if (rc != PMIX_SUCCESS)
        return make_error(pmix_error(pmix_, "PMIx_Get('" + key_text + "')", rc));
    }
    return take_bytes(key_text, value);
  }

 private:
  // The byte object in value (released either way).
  Result<Bytes> take_bytes(const std::string& key, pmix_value_t* value) const {
    Result<Bytes> out = make_error("wireup pmix: key '" + key + "' does not hold a byte object");
    if (value->type == PMIX_BYTE_OBJECT) {
      auto bytes = reinterpret_cast<const std::byte*>(value->data.bo.bytes);
      out = Bytes(bytes, bytes + value->data.bo.size);
    }
    release(value);
    return out;
  }

  // pmix.h's PMIX_INFO_LOAD, PMIX_INFO_DESTRUCT and PMIX_VALUE_RELEASE, through the table.
  void load(pmix_info_t& info, const char* key, const void* data, pmix_data_type_t type) const {
    (void)pmix_.info_load(&info, key, data, type);
  }
  void destruct(pmix_info_t& info) const {
    // the flag itself: PMIx 5's PMIX_INFO_IS_PERSISTENT is a library call, not in the table
    if ((info.flags & PMIX_INFO_PERSISTENT) == 0) pmix_.value_destruct(&info.value);
  }
  void release(pmix_value_t* value) const {
    pmix_.value_destruct(value);
    std::free(value);
  }

  pmix_rank_t guessed_owner(std::string_view key) const {
    auto slash = key.rfind('/');
    if (slash == std::string_view::npos) return PMIX_RANK_UNDEF;
    auto digits = key.substr(slash + 1);
    int rank = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
    if (ec != std::errc() || end != digits.data() + digits.size() || rank < 0 || rank >= size_) {
      return PMIX_RANK_UNDEF;
    }
    return static_cast<pmix_rank_t>(rank);
  }

  explicit PmixStore(const PmixApi& pmix) : pmix_(pmix) {}

  const PmixApi& pmix_;
  pmix_proc_t self_{};
  int size_ = 0;
  bool initialized_ = false;
};

}  // namespace

Result<std::unique_ptr<KvStore>> connect_pmix(const Environment&, milliseconds) {
  return PmixStore::connect();
}

}  // namespace topolaunch::wireup::detail

#else

namespace topolaunch::wireup::detail {
Result<std::unique_ptr<KvStore>> connect_pmix(const Environment&, milliseconds) {
  return make_error(
      "wireup pmix: this topolaunch was built without PMIx (libpmix-dev was missing at build "
      "time); "
      "use srun --mpi=pmi2, or the tcp store (TOPOLAUNCH_WIREUP=tcp)");
}
}  // namespace topolaunch::wireup::detail

#endif
