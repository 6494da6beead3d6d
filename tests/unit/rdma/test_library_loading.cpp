// UCX and libibverbs are dlopened on first use (ucx_api.hpp, verbs_api.hpp): a library that
// cannot be loaded is an error naming it and the variable that overrides its name, and on this
// host (where both are installed) they load by their SONAMEs with every entry point.
#include "catch.hpp"
#include "child_env.hpp"
#include "topolaunch/rdma/endpoint.hpp"
#include "ucx_api.hpp"
#include "verbs_api.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;
using Catch::Contains;
using Catch::StartsWith;
using testing::in_child_with;

namespace {

Result<std::string> ucx_status_text() {
  auto ucx = detail::load_ucx_api();
  if (!ucx) return ucx.error();
  return std::string(ucx->status_string(UCS_ERR_UNREACHABLE));
}

Result<std::string> verbs_status_text() {
  auto verbs = detail::load_verbs_api();
  if (!verbs) return verbs.error();
  return std::string(verbs->wc_status_str(IBV_WC_RETRY_EXC_ERR));
}

// What opening a transport says, as an error (the transports cannot open here: no RDMA NICs).
Result<std::string> transport_error(bool verbs) {
  auto t = verbs ? open_verbs_transport(0, VerbsTransportOptions{"rxe0", 1, 0, 14})
                 : open_ucx_transport(0, UcxTransportOptions{});
  if (t) return std::string("opened");
  return t.error();
}

}  // namespace

TEST_CASE("UCX: $TOPOLAUNCH_UCP_LIBRARY naming no file is an error naming the file and it") {
  auto r = in_child_with("TOPOLAUNCH_UCP_LIBRARY", "/nonexistent/libucp.so.0", ucx_status_text);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("cannot load /nonexistent/libucp.so.0 ("));
  CHECK_THAT(r.error().message, Contains("No such file or directory"));  // dlerror()'s text
  CHECK_THAT(r.error().message, Contains("$TOPOLAUNCH_UCP_LIBRARY"));
  CHECK(r.error().exit_code == 2);
}

TEST_CASE("UCX: $TOPOLAUNCH_UCS_LIBRARY naming no file is an error naming the file and it") {
  auto r = in_child_with("TOPOLAUNCH_UCS_LIBRARY", "/nonexistent/libucs.so.0", ucx_status_text);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("cannot load /nonexistent/libucs.so.0 ("));
  CHECK_THAT(r.error().message, Contains("$TOPOLAUNCH_UCS_LIBRARY"));
}

TEST_CASE("UCX: libucp.so.0 and libucs.so.0 load by their SONAMEs, every entry point found") {
  auto r = in_child_with("TOPOLAUNCH_UCP_LIBRARY", nullptr, ucx_status_text);
  INFO((r ? *r : r.error().message));
  REQUIRE(r);  // installed on this host (libucx0): a failure here is a broken host, not a skip
  CHECK(*r == "Destination is unreachable");  // called through the table
}

TEST_CASE("UCX: a node without libucp gets the UCX transport's error, naming the library") {
  auto r = in_child_with("TOPOLAUNCH_UCP_LIBRARY", "/nonexistent/libucp.so.0",
                         [] { return transport_error(false); });
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, StartsWith("rdma: UCX cannot be loaded on this node: cannot load "
                                           "/nonexistent/libucp.so.0 ("));
  CHECK_THAT(r.error().message, Contains("; or use the verbs transport (--transport verbs)"));
  CHECK(r.error().exit_code == 2);
}

TEST_CASE("verbs: $TOPOLAUNCH_IBVERBS_LIBRARY naming no file is an error naming the file and it") {
  auto r = in_child_with("TOPOLAUNCH_IBVERBS_LIBRARY", "/nonexistent/libibverbs.so.1",
                         verbs_status_text);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Contains("cannot load /nonexistent/libibverbs.so.1 ("));
  CHECK_THAT(r.error().message, Contains("No such file or directory"));
  CHECK_THAT(r.error().message, Contains("$TOPOLAUNCH_IBVERBS_LIBRARY"));
  CHECK(r.error().exit_code == 2);
}

TEST_CASE("verbs: libibverbs.so.1 loads by its SONAME, every entry point found") {
  auto r = in_child_with("TOPOLAUNCH_IBVERBS_LIBRARY", nullptr, verbs_status_text);
  INFO((r ? *r : r.error().message));
  REQUIRE(r);  // installed on this host (libibverbs1)
  CHECK(*r == "transport retry counter exceeded");
  auto dmabuf = in_child_with("TOPOLAUNCH_IBVERBS_LIBRARY", nullptr, []() -> Result<std::string> {
    auto verbs = detail::load_verbs_api();
    if (!verbs) return verbs.error();
    return std::string(verbs->reg_dmabuf_mr != nullptr ? "yes" : "no");
  });
  REQUIRE(dmabuf);
  CHECK(*dmabuf == "yes");  // rdma-core 44 has ibv_reg_dmabuf_mr (optional before 34)
}

TEST_CASE("verbs: a node without libibverbs gets the verbs transport's error, naming the library") {
  auto r = in_child_with("TOPOLAUNCH_IBVERBS_LIBRARY", "/nonexistent/libibverbs.so.1",
                         [] { return transport_error(true); });
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, StartsWith("rdma: ibverbs cannot be loaded on this node: cannot "
                                           "load /nonexistent/libibverbs.so.1 ("));
  CHECK_THAT(r.error().message, Contains("; or use the UCX transport (--transport ucx)"));
  CHECK(r.error().exit_code == 2);
}
