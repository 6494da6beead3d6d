#include "topolaunch/jobspec/toml_guard.hpp"

#include <fmt/format.h>

namespace topolaunch::jobspec {
namespace {

bool bare_key_character(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

std::string shown(char c) {
  if (c == '\n' || c == '\r') return "the end of the line";
  if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
    return fmt::format("byte {:#04x}", static_cast<unsigned char>(c));
  }
  return fmt::format("'{}'", c);
}

// A single pass over the text with just enough of the grammar to know where table headers can
// start: at the beginning of a line, outside strings and outside multi-line array values.
class Scanner {
 public:
  Scanner(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  Status run() {
    bool line_start = true;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\n') {
        newline(i_ + 1);
        ++i_;
        line_start = true;
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
        continue;
      }
      if (line_start && depth_ == 0 && c == '[') {
        if (Status header = check_header(); !header) return header;
        skip_to_end_of_line();
        line_start = false;
        continue;
      }
      line_start = false;
      if (c == '#') {
        skip_to_end_of_line();
      } else if (c == '"' || c == '\'') {
        skip_string(c);
      } else if (c == '[' || c == '{') {
        ++depth_;
        ++i_;
      } else if (c == ']' || c == '}') {
        if (depth_ > 0) --depth_;
        ++i_;
      } else {
        ++i_;
      }
    }
    return ok_status();
  }

 private:
  void newline(std::size_t next) {
    ++line_;
    line_begin_ = next;
  }

  void skip_to_end_of_line() {
    while (i_ < s_.size() && s_[i_] != '\n') ++i_;
  }

  // A basic ("...", """...""") or literal ('...', '''...''') string, newlines counted.
  void skip_string(char quote) {
    const bool multi_line = s_.substr(i_, 3) == std::string(3, quote);
    i_ += multi_line ? 3 : 1;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\\' && quote == '"') {
        if (i_ + 1 < s_.size() && s_[i_ + 1] == '\n') newline(i_ + 2);
        i_ += 2;
        continue;
      }
      if (c == '\n') {
        if (!multi_line) return;  // unterminated: the parser says so
        newline(i_ + 1);
        ++i_;
        continue;
      }
      if (c == quote) {
        if (!multi_line) {
          ++i_;
          return;
        }
        if (s_.substr(i_, 3) == std::string(3, quote)) {
          i_ += 3;
          // Up to two more quotes right before the delimiter belong to the content.
          for (int extra = 0; extra < 2 && i_ < s_.size() && s_[i_] == quote; ++extra) ++i_;
          return;
        }
      }
      ++i_;
    }
  }

  // At a '[' that starts a table header: what toml++ 3.3 would hand to parse_key() must be a
  // bare-key character or a quote (a ']' and the end of the text are refused cleanly there).
  Status check_header() {
    std::size_t j = i_ + 1;
    auto skip_blanks = [&] {
      const std::size_t from = j;
      while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t')) ++j;
      return j != from;
    };
    const bool blank_after_first = skip_blanks();
    if (j < s_.size() && s_[j] == '[') {
      if (blank_after_first) return ok_status();  // "[ [" is refused cleanly by toml++
      ++j;
      skip_blanks();
    }
    if (j >= s_.size()) return ok_status();
    const char c = s_[j];
    if (bare_key_character(c) || c == '"' || c == '\'' || c == ']') return ok_status();
    return make_error(fmt::format(
        "{}:{}:{}: TOML syntax error: a table name must start with a letter, digit, '_', '-' "
        "or a quote, not {} (e.g. [train])",
        path_, line_, j - line_begin_ + 1, shown(c)));
  }

  std::string_view s_;
  const std::string& path_;
  std::size_t i_ = 0;
  std::size_t line_ = 1;
  std::size_t line_begin_ = 0;
  int depth_ = 0;  // open '[' and '{' of values (arrays, inline tables) that span lines
};

}  // namespace

Status check_toml_text(std::string_view text, const std::string& path) {
  return Scanner(text, path).run();
}

}  // namespace topolaunch::jobspec
