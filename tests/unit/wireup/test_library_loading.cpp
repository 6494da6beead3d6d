// libpmix and libpmi2 are dlopened when a store connects (pmix_api.hpp, pmi2_api.hpp): a library
// that cannot be loaded is an error naming it and the variable that overrides its name, and on
// this host (where both are installed) they load by their SONAMEs with every entry point.
#include "catch.hpp"
#include "child_env.hpp"
#include "topolaunch/wireup/kv_store.hpp"

#ifdef TOPOLAUNCH_HAVE_PMIX
#include "pmix_api.hpp"
#endif
#ifdef TOPOLAUNCH_HAVE_PMI2
#include "pmi2_api.hpp"
#endif

using namespace topolaunch;
using namespace topolaunch::wireup;
using Catch::Contains;
using Catch::StartsWith;
using testing::in_child_with;

#if defined(TOPOLAUNCH_HAVE_PMIX) || defined(TOPOLAUNCH_HAVE_PMI2)
namespace {

// What connecting through `backend` says, as an error (there is no srun here to answer).
Result<std::string> connect_error(const char* backend) {
  auto store = connect_from_env({{"TOPOLAUNCH_WIREUP", backend}}, milliseconds(1000));
  if (store) return std::string("connected");
  return store.error();
}

}  // namespace
#endif

#ifdef TOPOLAUNCH_HAVE_PMIX
TEST_CASE("PMIx: $TOPOLAUNCH_PMIX_LIBRARY naming no file is an error naming the file and it") {
  auto r = in_child_with("TOPOLAUNCH_PMIX_LIBRARY", "/nonexistent/libpmix.so.2",
                         []() -> Result<std::string> {
                           auto pmix = detail::load_pmix_api();
                           if (!pmix) return pmix.error();
                           return std::string("loaded");
                         });
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("cannot load /nonexistent/libpmix.so.2 ("));
  CHECK_THAT(r.error().message, Contains("No such file or directory"));  // dlerror()'s text
  CHECK_THAT(r.error().message, Contains("$TOPOLAUNCH_PMIX_LIBRARY"));
  CHECK(r.error().exit_code == 2);
}

TEST_CASE("PMIx: libpmix.so.2 loads by its SONAME, every entry point found") {
  auto r = in_child_with("TOPOLAUNCH_PMIX_LIBRARY", nullptr, []() -> Result<std::string> {
    auto pmix = detail::load_pmix_api();
    if (!pmix) return pmix.error();
    return std::string(pmix->error_string(PMIX_ERR_TIMEOUT));  // called through the table
  });
  INFO((r ? *r : r.error().message));
  REQUIRE(r);  // installed on this host (libpmix2): a failure here is a broken host, not a skip
  CHECK(*r == "TIMEOUT");
}

TEST_CASE("PMIx: the PMIx wireup on a node without libpmix says which library, and why") {
  auto r = in_child_with("TOPOLAUNCH_PMIX_LIBRARY", "/nonexistent/libpmix.so.2",
                         [] { return connect_error("pmix"); });
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message,
             StartsWith("wireup pmix: cannot load /nonexistent/libpmix.so.2 (/nonexistent/"));
  CHECK_THAT(r.error().message, Contains("or use srun --mpi=pmi2, or the tcp store"));
}
#endif

#ifdef TOPOLAUNCH_HAVE_PMI2
TEST_CASE("PMI2: $TOPOLAUNCH_PMI2_LIBRARY naming no file is an error naming the file and it") {
  auto r = in_child_with("TOPOLAUNCH_PMI2_LIBRARY", "/nonexistent/libpmi2.so.0",
                         []() -> Result<std::string> {
                           auto pmi2 = detail::load_pmi2_api();
                           if (!pmi2) return pmi2.error();
                           return std::string("loaded");
                         });
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("cannot load /nonexistent/libpmi2.so.0 ("));
  CHECK_THAT(r.error().message, Contains("No such file or directory"));
  CHECK_THAT(r.error().message, Contains("$TOPOLAUNCH_PMI2_LIBRARY"));
  CHECK(r.error().exit_code == 2);
}

TEST_CASE("PMI2: libpmi2.so.0 loads by its SONAME, every entry point found") {
  auto r = in_child_with("TOPOLAUNCH_PMI2_LIBRARY", nullptr, []() -> Result<std::string> {
    auto pmi2 = detail::load_pmi2_api();
    if (!pmi2) return pmi2.error();
    return std::string("loaded");
  });
  INFO((r ? *r : r.error().message));
  REQUIRE(r);  // installed on this host (libpmi2-0)
}

TEST_CASE("PMI2: the PMI2 wireup on a node without libpmi2 says which library, and why") {
  auto r = in_child_with("TOPOLAUNCH_PMI2_LIBRARY", "/nonexistent/libpmi2.so.0",
                         [] { return connect_error("pmi2"); });
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message,
             StartsWith("wireup pmi2: cannot load /nonexistent/libpmi2.so.0 (/nonexistent/"));
  CHECK_THAT(r.error().message, Contains("or use srun --mpi=pmix, or the tcp store"));
}
#endif
