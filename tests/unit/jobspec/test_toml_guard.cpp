// check_toml_text: the table headers that abort toml++ 3.3 are refused with file:line:col, and
// the same characters where the grammar allows them (strings, comments, arrays) are not.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "topolaunch/jobspec/toml_guard.hpp"

using topolaunch::jobspec::check_toml_text;

namespace {
std::string refusal(const std::string& text) {
  auto s = check_toml_text(text, "job.toml");
  return s.ok() ? std::string() : s.error().message;
}
}  // namespace

TEST_CASE("toml guard: every header shape that aborts toml++ 3.3 is refused with its place") {
  CHECK(refusal("[+]\n") ==
        "job.toml:1:2: TOML syntax error: a table name must start with a letter, digit, '_', "
        "'-' or a quote, not '+' (e.g. [train])");
  CHECK(refusal("[*]").find("job.toml:1:2:") == 0);
  CHECK(refusal("[.]").find("job.toml:1:2:") == 0);
  CHECK(refusal("[[[").find("job.toml:1:3:") == 0);
  CHECK(refusal("[[[1]]]").find("job.toml:1:3:") == 0);
  CHECK(refusal("[[=").find("job.toml:1:3: ") == 0);
  CHECK(refusal("[\n").find("not the end of the line") != std::string::npos);
  CHECK(refusal("[job]\nname = \"x\"\n\n  [  +]\n").find("job.toml:4:6:") == 0);
  CHECK(refusal("[[ \t%]]").find("not '%'") != std::string::npos);
  CHECK(refusal("[\x01]").find("byte 0x01") != std::string::npos);
}

TEST_CASE("toml guard: valid headers and the same characters inside values pass") {
  CHECK(refusal("[job]\n[\"quoted key\"]\n['lit']\n[[mapping.explicit]]\n[ a . b ]\n").empty());
  CHECK(refusal("a = \"\"\"\n[+]\n\"\"\"\n").empty());
  CHECK(refusal("a = '''\n[*]\n'''\n").empty());
  CHECK(refusal("a = [\n  [1, 2],\n  [\n    3],\n]\n[b]\n").empty());
  CHECK(refusal("# [+] in a comment\n[ok]  # [*] too\n").empty());
  CHECK(refusal("a = \"\\\"[+]\"\n").empty());
  CHECK(refusal("a = \"\"\"x\"\"\"\"\n[b]\n").empty());  // a quote before the delimiter
  CHECK(refusal("[ [x]]").empty());                      // toml++ refuses "[ [" cleanly itself
  CHECK(refusal("[]").empty());                          // likewise the blank table name
  CHECK(refusal("[").empty());                           // and the end of the text
}

TEST_CASE("toml guard: after a multi-line array the next header is checked again") {
  CHECK(refusal("a = [\n 1,\n]\n[+]\n").find("job.toml:4:2:") == 0);
  CHECK(refusal("a = \"\"\"\nx\n\"\"\"\n[.]\n").find("job.toml:4:2:") == 0);
}

TEST_CASE("toml guard: every example config of the project passes") {
  int seen = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(TOPOLAUNCH_SOURCE_ROOT "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    INFO(entry.path());
    CHECK(refusal(text.str()).empty());
    ++seen;
  }
  CHECK(seen >= 5);
}
