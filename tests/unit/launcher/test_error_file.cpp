// The error file of a failed rank (launcher/src/error_file.hpp), as torch's @record writes it.
#include <string>

#include "catch.hpp"
#include "error_file.hpp"

using namespace topolaunch::launcher;

TEST_CASE("torch 1.13's @record error file: the exception and its traceback") {
  auto e = read_error_file(std::string(TOPOLAUNCH_SOURCE_ROOT) +
                           "/tests/fixtures/error_files/torch-1.13-record.json");
  REQUIRE(e);
  CHECK(e->message == "RuntimeError: rank 1 failed on purpose at step 20");
  CHECK(e->traceback.starts_with("Traceback (most recent call last):\n"));
  CHECK(e->traceback.find("in train") != std::string::npos);
}

TEST_CASE("a plain string message, a missing file and a file that is not one") {
  auto plain = parse_error_file(R"({"message": "ValueError: bad batch\nmore"})");
  REQUIRE(plain);
  CHECK(plain->message == "ValueError: bad batch");
  CHECK(plain->traceback.empty());
  CHECK_FALSE(read_error_file("/nonexistent/error.json"));
  CHECK_FALSE(parse_error_file(""));
  CHECK_FALSE(parse_error_file("not json"));
  CHECK_FALSE(parse_error_file(R"({"other": 1})"));
  CHECK_FALSE(parse_error_file(R"([1, 2])"));
}

TEST_CASE("a runaway traceback is cut to its last 16 KiB, where the exception is") {
  std::string tb(100'000, 'x');
  tb += "END";
  auto e = parse_error_file(R"({"message": {"message": "E: x", "extraInfo": {"py_callstack": ")" +
                            tb + R"("}}})");
  REQUIRE(e);
  CHECK(e->traceback.size() < 17 * 1024);
  CHECK(e->traceback.ends_with("END"));
}
