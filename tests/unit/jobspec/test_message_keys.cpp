// Every message a program of ours can print names the job file's keys as the file spells them:
// the string literals of the sources are searched for "table.key", "[table] key" and
// "snake_key = value", and each key found must be one the schema knows (a hint once said
// "mapping.ranks_per_node ... set allow_oversubscribe = true" for [job] ranks_per_node and
// [mapping] oversubscribe).
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "topolaunch/jobspec/job_config.hpp"

namespace fs = std::filesystem;
using topolaunch::jobspec::is_schema_key;

namespace {

struct Literal {
  std::string file;
  int line;
  std::string text;  // adjacent literals joined, as the compiler joins them
};

// The string literals of a C++ source, comments and character literals skipped.
std::vector<Literal> string_literals(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string src = buffer.str();
  std::vector<Literal> out;
  int line = 1;
  bool joinable = false;  // only whitespace since the last literal
  for (std::size_t i = 0; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '\n') ++line;
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      while (i < src.size() && src[i] != '\n') ++i;
      ++line;
      continue;
    }
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      for (i += 2; i + 1 < src.size() && !(src[i] == '*' && src[i + 1] == '/'); ++i)
        if (src[i] == '\n') ++line;
      ++i;
      continue;
    }
    if (c == '\'') {
      for (++i; i < src.size() && src[i] != '\''; ++i)
        if (src[i] == '\\') ++i;
      joinable = false;
      continue;
    }
    if (c == 'R' && i + 1 < src.size() && src[i + 1] == '"') {
      const std::size_t open = src.find('(', i + 2);
      const std::string close = ")" + src.substr(i + 2, open - i - 2) + "\"";
      const std::size_t end = src.find(close, open);
      const std::string text = src.substr(open + 1, end - open - 1);
      out.push_back({path.string(), line, text});
      for (char t : text)
        if (t == '\n') ++line;
      i = end + close.size() - 1;
      joinable = false;
      continue;
    }
    if (c == '"') {
      std::string text;
      for (++i; i < src.size() && src[i] != '"'; ++i) {
        if (src[i] == '\\' && i + 1 < src.size()) {
          ++i;
          text += src[i] == 'n' ? '\n' : src[i];
        } else {
          text += src[i];
        }
      }
      if (joinable && !out.empty()) {
        out.back().text += text;
      } else {
        out.push_back({path.string(), line, text});
      }
      joinable = true;
      continue;
    }
    if (!std::isspace(static_cast<unsigned char>(c))) joinable = false;
  }
  return out;
}

std::vector<fs::path> sources() {
  const fs::path root = TOPOLAUNCH_SOURCE_ROOT;
  std::vector<fs::path> files;
  for (const char* module :
       {"common", "jobspec", "topology", "wireup", "rdma", "kernels", "launcher", "spank_plugin"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / module)) {
      const auto ext = entry.path().extension();
      if (ext == ".cpp" || ext == ".hpp" || ext == ".cu" || ext == ".cuh") {
        files.push_back(entry.path());
      }
    }
  }
  return files;
}

// Keys named some other way than the schema's, each as "file:line: what".
std::vector<std::string> misnamed_keys(const Literal& literal) {
  static const std::regex dotted(
      R"((^|[^A-Za-z0-9_/.\-])(job|mapping|budget|rdma|wireup|worker|model|data|train)((\.[a-z_]+)+))");
  static const std::regex bracketed(
      R"(\[(job|mapping|budget|rdma|wireup|worker|model|data|train)\][ .]([a-z_]+))");
  static const std::regex assigned(R"(\b([a-z]+(_[a-z]+)+) = (true|false|"|[0-9]))");
  // "job.toml", "worker.hpp": files, not keys.
  static const std::set<std::string> extensions{"toml",   "json", "jsonl", "log", "py",
                                                "sh",     "hpp",  "cpp",   "cu",  "xml",
                                                "sbatch", "bin",  "txt",   "so",  "safetensors"};
  // "[model] on [data] as [train] and [budget] say": prose about a table, not a key.
  static const std::set<std::string> prose{"and", "as", "on",  "say",  "table", "or", "is",
                                           "in",  "of", "the", "from", "with",  "to", "tables"};
  std::vector<std::string> found;
  const std::string where = literal.file + ":" + std::to_string(literal.line) + ": ";
  for (std::sregex_iterator m(literal.text.begin(), literal.text.end(), dotted), end; m != end;
       ++m) {
    const std::string path = (*m)[3].str().substr(1);  // "ranks_per_node" or "explicit.rank"
    if (extensions.contains(path)) continue;
    const std::string key = (*m)[2].str() + "." + path;
    if (!is_schema_key(key)) found.push_back(where + key);
  }
  for (std::sregex_iterator m(literal.text.begin(), literal.text.end(), bracketed), end; m != end;
       ++m) {
    const std::string key = (*m)[1].str() + "." + (*m)[2].str();
    if (!prose.contains((*m)[2].str()) && !is_schema_key(key)) found.push_back(where + key);
  }
  for (std::sregex_iterator m(literal.text.begin(), literal.text.end(), assigned), end; m != end;
       ++m) {
    const std::string key = (*m)[1].str();
    bool known = false;
    for (const char* table : {"job", "mapping", "mapping.explicit", "budget", "rdma", "wireup",
                              "worker", "model", "data", "train"}) {
      known = known || is_schema_key(std::string(table) + "." + key);
    }
    if (!known) found.push_back(where + key + " = ...");
  }
  return found;
}

}  // namespace

TEST_CASE("the scan finds the keys a message names, and tells files and prose from keys") {
  auto misnamed = [](const std::string& text) { return misnamed_keys(Literal{"x.cpp", 1, text}); };
  CHECK(misnamed("mapping.ranks_per_node=8: set allow_oversubscribe = true").size() == 2);
  CHECK(misnamed("job.ranks_per_node=8: set [mapping] oversubscribe = true").empty());
  CHECK(misnamed("[mapping] allow_oversubscribe is not set").size() == 1);
  CHECK(misnamed("mapping.explicit.rank: rank 3 appears twice").empty());
  CHECK(misnamed("mapping.explicit.ranks: ...").size() == 1);
  CHECK(misnamed("job.toml:3:1: train.steps: expected an integer").empty());
  CHECK(misnamed("Trains [model] on [data] as [train] and [budget] say").empty());
  CHECK(misnamed("check mapping.nics").size() == 1);
  CHECK(misnamed("see tests/data.bin or a.model.hpp").empty());
  CHECK(is_schema_key("job.progress_timeout"));
  CHECK_FALSE(is_schema_key("job"));
  CHECK_FALSE(is_schema_key("nosuch.key"));
}

TEST_CASE("every message of every program names the job file's keys as the file spells them") {
  std::vector<std::string> misnamed;
  std::size_t literals = 0, files = 0;
  for (const fs::path& file : sources()) {
    ++files;
    for (const Literal& literal : string_literals(file)) {
      ++literals;
      for (std::string& m : misnamed_keys(literal)) misnamed.push_back(std::move(m));
    }
  }
  INFO(files << " files, " << literals << " string literals");
  CHECK(files > 100);
  CHECK(literals > 2000);
  for (const std::string& m : misnamed) {
    UNSCOPED_INFO(m);
  }
  CHECK(misnamed.empty());
}
