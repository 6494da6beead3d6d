// Reading TOML tables into plain data with one precise error line for the first problem: the
// schema (which keys each table knows), did-you-mean, and typed reads that name
// file:line:column and the dotted key. Private to jobspec.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "toml.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/common/units.hpp"

namespace topolaunch::jobspec::detail {

// The schema: which keys each table knows (for "unknown key" and "did you mean"). The root's
// entry lists the tables.
struct TableSchema {
  std::string_view table;
  std::vector<std::string_view> keys;
};
const std::vector<TableSchema>& schema();
const TableSchema* find_table(std::string_view table);

// " (did you mean \"restarts\"?)", " (it belongs in [job])", " (known keys: ...)" or "".
std::string did_you_mean(std::string_view table, std::string_view key);

std::string_view type_name(const toml::node& node);

// Reads one table. After the first error every call is a no-op, so parsing code reads straight.
class Reader {
 public:
  Reader(const std::string& path, std::optional<Error>& first_error)
      : path_(path), error_(first_error) {}

  bool failed() const { return error_.has_value(); }

  // "job.toml:12:9"; a value that came from an override names the override instead.
  std::string where(const toml::source_region& source) const;

  void fail(const toml::source_region& source, std::string_view key, std::string_view what) {
    if (!error_) error_ = make_error(fmt::format("{}: {}: {}", where(source), key, what));
  }
  // At `key` of `table` when it is written there, else at the table itself (a cross-check on a
  // default value).
  void fail_at(const toml::table& table, std::string_view prefix, std::string_view key,
               std::string_view what) {
    const toml::node* node = table.get(key);
    fail(node != nullptr ? node->source() : table.source(), fmt::format("{}.{}", prefix, key),
         what);
  }

  // Refuses keys the schema does not know.
  void check_keys(const toml::table& table, std::string_view table_name);

  void type_error(const toml::node& node, std::string_view dotted, std::string_view expected,
                  std::string_view example) {
    fail(node.source(), dotted,
         fmt::format("expected {}, got {} (e.g. {} = {})", expected, type_name(node),
                     dotted.substr(dotted.rfind('.') + 1), example));
  }

  void string(const toml::table& t, std::string_view prefix, std::string_view key, std::string& out,
              std::string_view example = "\"...\"");

  template <class Int>
  void integer(const toml::table& t, std::string_view prefix, std::string_view key, Int& out,
               std::int64_t min, std::int64_t max) {
    const toml::node* node = get(t, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    if (!node->is_integer()) {
      return type_error(*node, dotted, "an integer",
                        std::to_string(std::max<std::int64_t>(min, 1)));
    }
    std::int64_t v = node->as_integer()->get();
    if (v < min || v > max) {
      return fail(node->source(), dotted,
                  fmt::format("{} is out of range (allowed {}..{})", v, min, max));
    }
    out = static_cast<Int>(v);
  }

  void boolean(const toml::table& t, std::string_view prefix, std::string_view key, bool& out);

  void number(const toml::table& t, std::string_view prefix, std::string_view key, double& out,
              double min, double max);

  // Sizes: "16GiB" strings, or an integer number of bytes.
  void size(const toml::table& t, std::string_view prefix, std::string_view key, std::uint64_t& out,
            std::uint64_t max);

  template <class Duration>
  void duration(const toml::table& t, std::string_view prefix, std::string_view key, Duration& out,
                std::chrono::microseconds min, std::chrono::microseconds max) {
    const toml::node* node = get(t, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    if (!node->is_string()) return type_error(*node, dotted, "a duration", "\"90s\"");
    auto parsed = parse_duration(node->as_string()->get());
    if (!parsed) return fail(node->source(), dotted, parsed.error().message);
    if (*parsed < min || *parsed > max) {
      return fail(node->source(), dotted,
                  fmt::format("{} is out of range (allowed {}..{})", format_duration(*parsed),
                              format_duration(min), format_duration(max)));
    }
    out = std::chrono::duration_cast<Duration>(*parsed);
  }

  // One of a fixed set of words.
  template <class Enum>
  void choice(const toml::table& t, std::string_view prefix, std::string_view key, Enum& out,
              const std::vector<std::pair<std::string_view, Enum>>& words) {
    const toml::node* node = get(t, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    std::string list;
    for (const auto& [word, value] : words)
      list += (list.empty() ? "\"" : ", \"") + std::string(word) + "\"";
    if (!node->is_string())
      return type_error(*node, dotted, fmt::format("one of {}", list),
                        "\"" + std::string(words[0].first) + "\"");
    std::string_view text = node->as_string()->get();
    for (const auto& [word, value] : words) {
      if (word == text) {
        out = value;
        return;
      }
    }
    fail(node->source(), dotted, fmt::format("\"{}\" is not one of {}", text, list));
  }

  // A sub-table; absent = nullptr; present but not a table = error.
  const toml::table* table(const toml::table& t, std::string_view prefix, std::string_view key);

 private:
  const toml::node* get(const toml::table& table, std::string_view key) const {
    if (failed()) return nullptr;
    return table.get(key);
  }

  const std::string& path_;
  std::optional<Error>& error_;
};

}  // namespace topolaunch::jobspec::detail
