#include "topolaunch/topology/switch_tree.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

namespace topolaunch::topology {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Splits at commas that are not inside brackets.
Result<std::vector<std::string_view>> split_top_level(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') {
      if (++depth > 1) {
        return make_error(fmt::format("\"{}\": nested '['", text));
      }
    } else if (text[i] == ']') {
      if (--depth < 0) {
        return make_error(fmt::format("\"{}\": unbalanced ']'", text));
      }
    } else if (text[i] == ',' && depth == 0) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) {
    return make_error(fmt::format("\"{}\": unbalanced '['", text));
  }
  parts.push_back(text.substr(start));
  return parts;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Expands one name that may hold several bracket groups: "r[1-2]n[3,5]".
Status expand_one(std::string_view name, std::vector<std::string>& out) {
  auto open = name.find('[');
  if (open == std::string_view::npos) {
    if (name.find(']') != std::string_view::npos) {
      return make_error(fmt::format("\"{}\": unbalanced ']'", name));
    }
    out.emplace_back(name);
    return ok_status();
  }
  auto close = name.find(']', open);
  if (close == std::string_view::npos) {
    return make_error(fmt::format("\"{}\": unbalanced '['", name));
  }
  std::string_view prefix = name.substr(0, open);
  std::string_view ranges = name.substr(open + 1, close - open - 1);
  std::string_view suffix = name.substr(close + 1);
  if (ranges.empty()) {
    return make_error(fmt::format("\"{}\": empty '[]'", name));
  }
  std::vector<std::string> middles;
  std::size_t start = 0;
  while (start <= ranges.size()) {
    auto comma = ranges.find(',', start);
    std::string_view item = ranges.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    auto dash = item.find('-');
    std::string_view lo = item.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi)) {
      return make_error(
          fmt::format("\"{}\": \"{}\" is not a number or a range like 1-4", name, item));
    }
    if (lo.size() > 9 || hi.size() > 9) {
      return make_error(fmt::format("\"{}\": \"{}\" is too large", name, item));
    }
    long first = std::stol(std::string(lo));
    long last = std::stol(std::string(hi));
    if (last < first) {
      return make_error(fmt::format("\"{}\": descending range {}", name, item));
    }
    if (last - first > 1'000'000) {
      return make_error(fmt::format("\"{}\": range {} is too large", name, item));
    }
    // Zero padding follows the lower bound as written ("n[01-10]" -> n01..n10).
    std::size_t width = lo.size() > 1 && lo[0] == '0' ? lo.size() : 0;
    for (long v = first; v <= last; ++v) {
      middles.push_back(fmt::format("{:0{}d}", v, width));
    }
    if (comma == std::string_view::npos) {
      break;
    }
    start = comma + 1;
  }
  std::vector<std::string> tails;
  if (auto status = expand_one(suffix, tails); !status) {
    return status;
  }
  for (const auto& middle : middles) {
    for (const auto& tail : tails) {
      out.push_back(fmt::format("{}{}{}", prefix, middle, tail));
    }
  }
  return ok_status();
}

struct Record {
  int line = 0;
  std::vector<std::pair<std::string, std::string>> fields;  // key lower-cased
  std::vector<std::string> keys_as_written;                 // for messages
};

// key=value tokens separated by blanks; '#' starts a comment. Continuation lines ("\") joined.
Result<std::vector<Record>> read_records(std::string_view text, const std::string& origin) {
  std::vector<Record> records;
  int line_number = 0;
  std::size_t pos = 0;
  std::string pending;
  int pending_line = 0;
  while (pos <= text.size()) {
    auto end = text.find('\n', pos);
    std::string_view line =
        text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    ++line_number;
    pos = end == std::string_view::npos ? text.size() + 1 : end + 1;
    if (auto hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    if (!line.empty() && line.back() == '\r') {
      line.remove_suffix(1);
    }
    if (pending.empty()) {
      pending_line = line_number;
    }
    bool continued = !line.empty() && line.back() == '\\';
    if (continued) {
      line.remove_suffix(1);
    }
    pending.append(line);
    pending.push_back(' ');
    if (continued) {
      continue;
    }
    Record record;
    record.line = pending_line;
    std::istringstream tokens(pending);
    std::string token;
    while (tokens >> token) {
      auto eq = token.find('=');
      if (eq == std::string::npos || eq == 0) {
        return make_error(
            fmt::format("{}:{}: \"{}\": expected key=value (e.g. SwitchName=s1 Nodes=n[1-4])",
                        origin, pending_line, token));
      }
      std::string value = token.substr(eq + 1);
      if (value.empty()) {
        return make_error(
            fmt::format("{}:{}: {}: empty value", origin, pending_line, token.substr(0, eq)));
      }
      record.fields.emplace_back(lower(token.substr(0, eq)), value);
      record.keys_as_written.push_back(token.substr(0, eq));
    }
    pending.clear();
    if (!record.fields.empty()) {
      records.push_back(std::move(record));
    }
  }
  return records;
}

Result<SwitchTree> build_tree(std::string_view text, const std::string& origin, bool strict_keys) {
  auto records = read_records(text, origin);
  if (!records) {
    return records.error();
  }
  SwitchTree tree;
  tree.origin = origin;
  std::map<std::string, int> index_of;
  std::vector<std::vector<int>> child_lines;  // line per child entry, for messages
  for (const Record& record : *records) {
    SwitchTree::Switch sw;
    sw.source_line = record.line;
    bool has_name = false;
    for (std::size_t f = 0; f < record.fields.size(); ++f) {
      const auto& [key, value] = record.fields[f];
      if (key == "switchname") {
        if (has_name) {
          return make_error(
              fmt::format("{}:{}: SwitchName: given twice on one line", origin, record.line));
        }
        if (value.find_first_of("[],") != std::string::npos) {
          return make_error(fmt::format("{}:{}: SwitchName: \"{}\" must be one name, not a list",
                                        origin, record.line, value));
        }
        sw.name = value;
        has_name = true;
      } else if (key == "switches" || key == "nodes") {
        auto names = expand_hostlist(value);
        if (!names) {
          return make_error(fmt::format("{}:{}: {}: {}", origin, record.line,
                                        key == "nodes" ? "Nodes" : "Switches",
                                        names.error().message));
        }
        auto& target = key == "nodes" ? sw.nodes : sw.switches;
        target.insert(target.end(), names->begin(), names->end());
      } else if (key == "linkspeed" || !strict_keys) {
        // LinkSpeed is documented but unused by the tree plugin; scontrol adds Level= etc.
      } else {
        return make_error(fmt::format(
            "{}:{}: {}: unknown key (topology.conf knows SwitchName, Switches, Nodes, LinkSpeed)",
            origin, record.line, record.keys_as_written[f]));
      }
    }
    if (!has_name) {
      return make_error(fmt::format("{}:{}: SwitchName: missing (every line describes one switch)",
                                    origin, record.line));
    }
    if (!index_of.emplace(sw.name, static_cast<int>(tree.switches.size())).second) {
      return make_error(fmt::format("{}:{}: SwitchName: \"{}\" is defined twice (first on line {})",
                                    origin, record.line, sw.name,
                                    tree.switches[index_of[sw.name]].source_line));
    }
    tree.switches.push_back(std::move(sw));
  }
  // Children must exist, have one parent, and there is no cycle; a node sits under one switch.
  std::vector<int> parent(tree.switches.size(), -1);
  std::map<std::string, int> node_switch;
  for (std::size_t i = 0; i < tree.switches.size(); ++i) {
    const auto& sw = tree.switches[i];
    for (const auto& child : sw.switches) {
      auto it = index_of.find(child);
      if (it == index_of.end()) {
        return make_error(
            fmt::format("{}:{}: Switches: \"{}\" is not defined by any SwitchName line", origin,
                        sw.source_line, child));
      }
      if (it->second == static_cast<int>(i)) {
        return make_error(
            fmt::format("{}:{}: Switches: \"{}\" lists itself", origin, sw.source_line, child));
      }
      if (parent[it->second] != -1) {
        return make_error(fmt::format("{}:{}: Switches: \"{}\" already has parent \"{}\" (line {})",
                                      origin, sw.source_line, child,
                                      tree.switches[parent[it->second]].name,
                                      tree.switches[parent[it->second]].source_line));
      }
      parent[it->second] = static_cast<int>(i);
    }
    for (const auto& node : sw.nodes) {
      auto [it, inserted] = node_switch.emplace(node, static_cast<int>(i));
      if (!inserted) {
        return make_error(fmt::format(
            "{}:{}: Nodes: \"{}\" is already under switch \"{}\" (line {})", origin, sw.source_line,
            node, tree.switches[it->second].name, tree.switches[it->second].source_line));
      }
    }
  }
  for (std::size_t i = 0; i < tree.switches.size(); ++i) {
    std::size_t steps = 0;
    for (int p = parent[i]; p != -1; p = parent[p]) {
      if (++steps > tree.switches.size()) {
        return make_error(fmt::format("{}:{}: Switches: switch \"{}\" is part of a cycle", origin,
                                      tree.switches[i].source_line, tree.switches[i].name));
      }
    }
  }
  return tree;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view text) {
  auto parts = split_top_level(text);
  if (!parts) {
    return parts.error();
  }
  std::vector<std::string> names;
  for (std::string_view part : *parts) {
    if (part.empty()) {
      return make_error(fmt::format("\"{}\": empty name in list", text));
    }
    if (auto status = expand_one(part, names); !status) {
      return status.error();
    }
  }
  return names;
}

Result<SwitchTree> parse_topology_conf(std::string_view text, const std::string& origin) {
  return build_tree(text, origin, /*strict_keys=*/true);
}

Result<SwitchTree> parse_scontrol_topology(std::string_view text, const std::string& origin) {
  return build_tree(text, origin, /*strict_keys=*/false);
}

Result<SwitchTree> load_switch_tree(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return make_error(
        fmt::format("{}: cannot open the switch tree file (topology.conf or "
                    "`scontrol show topology` output)",
                    path));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  // scontrol prints Level= on every record; topology.conf never has it.
  if (lower(text).find("level=") != std::string::npos) {
    return parse_scontrol_topology(text, path);
  }
  return parse_topology_conf(text, path);
}

std::vector<std::string> SwitchTree::node_order() const {
  std::map<std::string, int> index_of;
  std::vector<bool> is_child(switches.size(), false);
  for (std::size_t i = 0; i < switches.size(); ++i) {
    index_of.emplace(switches[i].name, static_cast<int>(i));
  }
  for (const auto& sw : switches) {
    for (const auto& child : sw.switches) {
      if (auto it = index_of.find(child); it != index_of.end()) {
        is_child[it->second] = true;
      }
    }
  }
  std::vector<std::string> order;
  std::vector<bool> seen(switches.size(), false);
  std::vector<int> stack;
  for (std::size_t root = 0; root < switches.size(); ++root) {
    if (is_child[root]) {
      continue;
    }
    stack.push_back(static_cast<int>(root));
    while (!stack.empty()) {
      int current = stack.back();
      stack.pop_back();
      if (seen[current]) {
        continue;
      }
      seen[current] = true;
      const auto& sw = switches[current];
      order.insert(order.end(), sw.nodes.begin(), sw.nodes.end());
      for (auto it = sw.switches.rbegin(); it != sw.switches.rend(); ++it) {
        if (auto found = index_of.find(*it); found != index_of.end()) {
          stack.push_back(found->second);
        }
      }
    }
  }
  return order;
}

SwitchDistance::SwitchDistance(const SwitchTree& tree) {
  std::map<std::string, int> index_of;
  for (std::size_t i = 0; i < tree.switches.size(); ++i) {
    index_of.emplace(tree.switches[i].name, static_cast<int>(i));
  }
  std::vector<int> parent(tree.switches.size(), -1);
  for (std::size_t i = 0; i < tree.switches.size(); ++i) {
    for (const auto& child : tree.switches[i].switches) {
      if (auto it = index_of.find(child); it != index_of.end()) {
        parent[it->second] = static_cast<int>(i);
      }
    }
  }
  for (std::size_t i = 0; i < tree.switches.size(); ++i) {
    std::vector<int> chain;
    for (int s = static_cast<int>(i); s != -1 && chain.size() <= tree.switches.size();
         s = parent[s]) {
      chain.push_back(s);
    }
    std::reverse(chain.begin(), chain.end());
    for (const auto& node : tree.switches[i].nodes) {
      paths_.emplace_back(node, chain);
    }
  }
  std::sort(paths_.begin(), paths_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
}

const std::vector<int>* SwitchDistance::path(std::string_view node) const {
  auto it =
      std::lower_bound(paths_.begin(), paths_.end(), node,
                       [](const auto& entry, std::string_view key) { return entry.first < key; });
  if (it == paths_.end() || it->first != node) {
    return nullptr;
  }
  return &it->second;
}

int SwitchDistance::hops_between(const std::vector<int>* a, const std::vector<int>* b) {
  if (a == nullptr || b == nullptr) {
    return 1;
  }
  std::size_t common = 0;
  while (common < a->size() && common < b->size() && (*a)[common] == (*b)[common]) {
    ++common;
  }
  if (common == 0) {
    // Different roots: up both trees and across an unknown core switch.
    return static_cast<int>(a->size() + b->size()) + 1;
  }
  // Up from a's leaf to the common switch, and down to b's leaf: the common one counted once.
  return static_cast<int>((a->size() - common) + (b->size() - common)) + 1;
}

int SwitchDistance::hops(std::string_view a, std::string_view b) const {
  if (a == b) {
    return 0;
  }
  return hops_between(path(a), path(b));
}

}  // namespace topolaunch::topology
