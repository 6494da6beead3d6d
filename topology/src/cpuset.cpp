#include "topolaunch/topology/cpuset.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>

namespace topolaunch::topology {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

std::optional<int> parse_int(std::string_view s) {
  s = trim(s);
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || value < 0) {
    return std::nullopt;
  }
  return value;
}

// Guards against "0-2000000000" allocating gigabytes; no machine has a million PUs.
constexpr int kMaxId = 1 << 20;

}  // namespace

CpuSet::CpuSet(std::vector<int> ids) : ids_(std::move(ids)) {
  std::erase_if(ids_, [](int id) { return id < 0; });
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
}

std::optional<CpuSet> CpuSet::parse_list(std::string_view text) {
  text = trim(text);
  std::vector<int> ids;
  if (text.empty()) {
    return CpuSet();
  }
  while (true) {
    auto comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    auto dash = item.find('-');
    if (dash == std::string_view::npos) {
      auto id = parse_int(item);
      if (!id) {
        return std::nullopt;
      }
      ids.push_back(*id);
    } else {
      auto lo = parse_int(item.substr(0, dash));
      auto hi = parse_int(item.substr(dash + 1));
      if (!lo || !hi || *hi < *lo || *hi > kMaxId) {
        return std::nullopt;
      }
      for (int id = *lo; id <= *hi; ++id) {
        ids.push_back(id);
      }
    }
    if (comma == std::string_view::npos) {
      break;
    }
    text.remove_prefix(comma + 1);
  }
  return CpuSet(std::move(ids));
}

std::optional<CpuSet> CpuSet::parse_mask(std::string_view text) {
  text = trim(text);
  if (text.empty()) {
    return std::nullopt;
  }
  // Split into words; the last word holds bits 0..31.
  std::vector<std::string_view> words;
  while (true) {
    auto comma = text.find(',');
    words.push_back(trim(text.substr(0, comma)));
    if (comma == std::string_view::npos) {
      break;
    }
    text.remove_prefix(comma + 1);
  }
  std::vector<int> ids;
  const std::size_t count = words.size();
  for (std::size_t w = 0; w < count; ++w) {
    std::string_view word = words[w];
    if (word.starts_with("0x") || word.starts_with("0X")) {
      word.remove_prefix(2);
    }
    if (word.empty()) {
      continue;  // hwloc writes all-zero words as nothing
    }
    std::uint64_t bits = 0;
    auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), bits, 16);
    if (ec != std::errc() || end != word.data() + word.size() || bits > 0xffffffffULL) {
      return std::nullopt;
    }
    const int base = static_cast<int>(count - 1 - w) * 32;
    for (int bit = 0; bit < 32; ++bit) {
      if (bits & (std::uint64_t{1} << bit)) {
        ids.push_back(base + bit);
      }
    }
  }
  return CpuSet(std::move(ids));
}

std::string CpuSet::to_list() const {
  std::string out;
  std::size_t i = 0;
  while (i < ids_.size()) {
    std::size_t j = i;
    while (j + 1 < ids_.size() && ids_[j + 1] == ids_[j] + 1) {
      ++j;
    }
    if (!out.empty()) {
      out += ',';
    }
    out += std::to_string(ids_[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ids_[j]);
    }
    i = j + 1;
  }
  return out;
}

bool CpuSet::contains(int id) const { return std::binary_search(ids_.begin(), ids_.end(), id); }

bool CpuSet::contains_all(const CpuSet& other) const {
  return std::includes(ids_.begin(), ids_.end(), other.ids_.begin(), other.ids_.end());
}

// A merge walk that stops at the first common id: the rank map asks this of every GPU's and
// NIC's locality against every core, and building the intersection allocated each time.
bool CpuSet::intersects(const CpuSet& other) const {
  auto a = ids_.begin(), b = other.ids_.begin();
  while (a != ids_.end() && b != other.ids_.end()) {
    if (*a == *b) return true;
    if (*a < *b) {
      a = std::lower_bound(a, ids_.end(), *b);
    } else {
      b = std::lower_bound(b, other.ids_.end(), *a);
    }
  }
  return false;
}

CpuSet CpuSet::operator&(const CpuSet& other) const {
  CpuSet out;
  std::set_intersection(ids_.begin(), ids_.end(), other.ids_.begin(), other.ids_.end(),
                        std::back_inserter(out.ids_));
  return out;
}

CpuSet CpuSet::operator|(const CpuSet& other) const {
  CpuSet out;
  std::set_union(ids_.begin(), ids_.end(), other.ids_.begin(), other.ids_.end(),
                 std::back_inserter(out.ids_));
  return out;
}

CpuSet CpuSet::operator-(const CpuSet& other) const {
  CpuSet out;
  std::set_difference(ids_.begin(), ids_.end(), other.ids_.begin(), other.ids_.end(),
                      std::back_inserter(out.ids_));
  return out;
}

}  // namespace topolaunch::topology
