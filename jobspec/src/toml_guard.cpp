#include "topolaunch/jobspec/toml_guard.hpp"

#include <fmt/format.h>

#include <vector>

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
        in_bare_ = false;
        key_context_ = open_.empty() || open_.back() == '{';
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r') {
        in_bare_ = false;
        ++i_;
        continue;
      }
      if (line_start && open_.empty() && c == '[') {
        if (Status header = check_header(); !header) return header;
        ++i_;  // the rest of the header is scanned like any text: its keys, quotes, comment
        line_start = false;
        key_context_ = true;
        continue;
      }
      line_start = false;
      if (static_cast<unsigned char>(c) >= 0x80) {
        // Not TOML 1.0 anyway (bare keys and values are ASCII); toml++ 3.3 asks
        // is_non_ascii_horizontal_whitespace() about it, which reaches __builtin_unreachable()
        // for most code points from U+00A1 on (undefined behaviour).
        return refuse(fmt::format("{} outside a string or comment", shown(c)));
      }
      if (c == '#') {
        in_bare_ = false;
        skip_to_end_of_line();
        continue;
      }
      const bool value_expected = array_value_expected_;
      array_value_expected_ = false;
      if (in_bare_) {
        // toml++ reads a bare value (number, boolean, date) up to a value terminator, so quotes,
        // brackets and '=' inside it are part of it ("s=0='..."); a bare key also ends at '='
        // and '.'.
        const bool ends =
            c == ']' || c == '}' || c == ',' || (bare_is_key_ && (c == '=' || c == '.'));
        if (!ends) {
          ++i_;
          continue;
        }
        in_bare_ = false;
      }
      if (c == '"' || c == '\'') {
        if (Status string = skip_string(c); !string) return string;
      } else if (c == '[' || c == '{') {
        open_.push_back(c);
        array_value_expected_ = c == '[';
        key_context_ = c == '{';
        ++i_;
      } else if (c == ']' || c == '}') {
        // toml++ 3.3 hands a '}' where an array value should start to parse_value(), which
        // asserts it is not a value terminator: "[}", "[1, }" abort the process.
        if (c == '}' && value_expected) return refuse("'}' where an array value is expected");
        if (!open_.empty()) open_.pop_back();
        ++i_;
      } else if (c == ',') {
        array_value_expected_ = !open_.empty() && open_.back() == '[';
        key_context_ = !open_.empty() && open_.back() == '{';
        ++i_;
      } else if (c == '=') {
        key_context_ = false;
        ++i_;
      } else if (c == '.') {
        ++i_;  // between the parts of a dotted key
      } else {
        in_bare_ = true;
        bare_is_key_ = key_context_;
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
  Status skip_string(char quote) {
    const bool multi_line = s_.substr(i_, 3) == std::string(3, quote);
    i_ += multi_line ? 3 : 1;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\\' && quote == '"') {
        if (multi_line) {
          // toml++ 3.3 asks is_whitespace() about the character after a backslash, and after a
          // line-ending backslash skips blanks and newlines asking is_horizontal_whitespace():
          // a non-ASCII character there is the same undefined behaviour as outside a string.
          std::size_t j = i_ + 1;
          while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\r' || s_[j] == '\n'))
            ++j;
          if (j < s_.size() && static_cast<unsigned char>(s_[j]) >= 0x80) {
            for (; i_ < j; ++i_)
              if (s_[i_] == '\n') newline(i_ + 1);
            return refuse(fmt::format(
                "{} after a backslash in a multi-line string (write it as \\uXXXX)", shown(s_[j])));
          }
        }
        if (i_ + 1 < s_.size() && s_[i_ + 1] == '\n') newline(i_ + 2);
        i_ += 2;
        continue;
      }
      if (c == '\n') {
        if (!multi_line) return ok_status();  // unterminated: the parser says so
        newline(i_ + 1);
        ++i_;
        continue;
      }
      if (c == quote) {
        if (!multi_line) {
          ++i_;
          return ok_status();
        }
        if (s_.substr(i_, 3) == std::string(3, quote)) {
          i_ += 3;
          // Up to two more quotes right before the delimiter belong to the content.
          for (int extra = 0; extra < 2 && i_ < s_.size() && s_[i_] == quote; ++extra) ++i_;
          return ok_status();
        }
      }
      ++i_;
    }
    return ok_status();
  }

  Error refuse(const std::string& what) const {
    return make_error(
        fmt::format("{}:{}:{}: TOML syntax error: {}", path_, line_, i_ - line_begin_ + 1, what));
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
  std::vector<char> open_;             // the open '[' and '{' of values (arrays, inline tables)
  bool array_value_expected_ = false;  // just after an array's '[' or ','
  bool key_context_ = true;  // a key comes next: a line's start, after '{' or an inline ','
  bool in_bare_ = false;     // inside a bare key or value (up to a blank or a terminator)
  bool bare_is_key_ = false;
};

}  // namespace

Status check_toml_text(std::string_view text, const std::string& path) {
  return Scanner(text, path).run();
}

}  // namespace topolaunch::jobspec
