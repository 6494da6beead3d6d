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

TEST_CASE("toml guard: non-ASCII outside strings and after a multi-line backslash is refused") {
  // Found by tests/fuzz/fuzz_job_config: toml++ 3.3's is_non_ascii_horizontal_whitespace()
  // reaches __builtin_unreachable() for most code points from U+00A1 on (UBSan: "execution
  // reached an unreachable program point"), asked outside strings and after a backslash in a
  // multi-line basic string.
  CHECK(refusal("[job]\nname \xc3\x8b= \"x\"\n") ==
        "job.toml:2:6: TOML syntax error: byte 0xc3 outside a string or comment");
  CHECK(refusal("a = 1\xc3\xa9\n").find("job.toml:1:6: TOML syntax error: byte 0xc3") == 0);
  CHECK(refusal("[a.\xc3\xa9]\n").find("job.toml:1:4:") == 0);
  CHECK(refusal("a = \"\"\"x\\   \n \n  \xc3\xa9\"\"\"\n") ==
        "job.toml:3:3: TOML syntax error: byte 0xc3 after a backslash in a multi-line string "
        "(write it as \\uXXXX)");
  CHECK(refusal("a = \"\"\"\\\xc3\xa9\"\"\"\n").find("job.toml:1:9:") == 0);
  // Where TOML allows any character, it passes: strings, quoted keys, comments.
  CHECK(refusal("name = \"caf\xc3\xa9\"  # \xc3\xa9\n\"\xc3\xa9\" = 1\n[\"\xc3\xa9\"]\n").empty());
  CHECK(refusal("a = '''\xc3\xa9\\'''\nb = \"\"\"\\n\xc3\xa9\"\"\"\n").empty());
}

TEST_CASE("toml guard: a '}' where an array value starts, and a quote inside a bare value") {
  // Found by tests/fuzz/fuzz_job_config (second run): toml++ 3.3 asserts in parse_value() on
  // "[}" (abort), and reads a quote after a bare value's first character as part of that value,
  // so the non-ASCII byte after it is outside a string for toml++.
  CHECK(refusal("d=[}\n") ==
        "job.toml:1:4: TOML syntax error: '}' where an array value is expected");
  CHECK(refusal("d = [1, # c\n }\n").find("job.toml:2:2:") == 0);
  CHECK(refusal("d={a=[}}\n").find("job.toml:1:7:") == 0);
  CHECK(refusal("s=3\"\xd1\x91\n").find("job.toml:1:5: TOML syntax error: byte 0xd1") == 0);
  CHECK(refusal("s=0='\xce\x8f\n").find("job.toml:1:6: TOML syntax error: byte 0xce") == 0);
  CHECK(refusal("a.\"b\" = \"\xce\x8f\"\nc = { d = '\xce\x8f', e = 1.5 }\n").empty());
  CHECK(refusal("d = []\ne = {}\nf = [{}, {a = 1}, ]\ng = [[1], [\"}\"]]\n").empty());
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
