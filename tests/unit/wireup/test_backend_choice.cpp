// Which wireup backend an environment selects, and the errors when none fits.
#include "catch.hpp"
#include "topolaunch/wireup/kv_store.hpp"

using namespace topolaunch::wireup;

TEST_CASE("the tcp store address wins over inherited PMIx/PMI2 variables") {
  topolaunch::Environment env{{"TOPOLAUNCH_STORE_ADDR", "127.0.0.1:5000"},
                              {"PMIX_RANK", "0"},
                              {"PMIX_NAMESPACE", "slurm.pmix.1.0"},
                              {"PMI_FD", "5"}};
  auto backend = choose_backend(env);
  REQUIRE(backend.ok());
  CHECK(*backend == Backend::tcp);
}

TEST_CASE("srun's PMIx and PMI2 environments are recognised, PMIx first") {
  auto pmix =
      choose_backend({{"PMIX_RANK", "3"}, {"PMIX_NAMESPACE", "slurm.pmix.7.0"}, {"PMI_RANK", "3"}});
  REQUIRE(pmix.ok());
  CHECK(*pmix == Backend::pmix);
  auto pmi2 = choose_backend({{"PMI_FD", "9"}, {"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});
  REQUIRE(pmi2.ok());
  CHECK(*pmi2 == Backend::pmi2);
  CHECK_FALSE(choose_backend({{"PMIX_RANK", "3"}}).ok());  // half a PMIx environment is not one
}

TEST_CASE("TOPOLAUNCH_WIREUP forces a backend; unknown names are refused") {
  auto forced = choose_backend({{"TOPOLAUNCH_WIREUP", "pmi2"}, {"TOPOLAUNCH_STORE_ADDR", "h:1"}});
  REQUIRE(forced.ok());
  CHECK(*forced == Backend::pmi2);
  auto bad = choose_backend({{"TOPOLAUNCH_WIREUP", "etcd"}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("TOPOLAUNCH_WIREUP=etcd") != std::string::npos);
}

TEST_CASE("no wireup at all is one clear error") {
  auto none = choose_backend({{"HOME", "/root"}});
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message.find("no wireup found") != std::string::npos);
}

TEST_CASE("tcp from env needs a secret and a rank below the world size, each named") {
  topolaunch::Environment env{{"TOPOLAUNCH_STORE_ADDR", "127.0.0.1:1"},
                              {"TOPOLAUNCH_RANK", "0"},
                              {"TOPOLAUNCH_WORLD_SIZE", "2"}};
  auto no_secret = connect_from_env(env, milliseconds(10));
  REQUIRE_FALSE(no_secret.ok());
  CHECK(no_secret.error().message.find("TOPOLAUNCH_STORE_SECRET") != std::string::npos);

  env["TOPOLAUNCH_STORE_SECRET"] = "s";
  env["TOPOLAUNCH_RANK"] = "two";
  auto bad_rank = connect_from_env(env, milliseconds(10));
  REQUIRE_FALSE(bad_rank.ok());
  CHECK(bad_rank.error().message.find("TOPOLAUNCH_RANK=two") != std::string::npos);

  env["TOPOLAUNCH_RANK"] = "2";
  auto too_big = connect_from_env(env, milliseconds(10));
  REQUIRE_FALSE(too_big.ok());
  CHECK(too_big.error().message.find("not below the world size 2") != std::string::npos);

  env["TOPOLAUNCH_STORE_ADDR"] = "nohost";
  auto bad_addr = connect_from_env(env, milliseconds(10));
  REQUIRE_FALSE(bad_addr.ok());
  CHECK(bad_addr.error().message.find("TOPOLAUNCH_STORE_ADDR=nohost") != std::string::npos);
}

TEST_CASE("the tcp backend is always compiled in") {
  auto names = compiled_backends();
  CHECK(names.front() == "tcp");
}
