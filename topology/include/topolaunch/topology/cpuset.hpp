// A set of OS indexes (PUs, or NUMA nodes), printed like nvidia-smi / taskset -c: "48-63,176-191".
#pragma once

#include <compare>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace topolaunch::topology {

class CpuSet {
 public:
  CpuSet() = default;
  explicit CpuSet(std::vector<int> ids);  // sorts, removes duplicates and negatives

  // "0-3,8,10-11"; "" is the empty set. nullopt on any syntax error or descending range.
  static std::optional<CpuSet> parse_list(std::string_view text);
  // Linux cpumask as in /sys/.../local_cpus and hwloc XML: comma-separated 32-bit hex words,
  // most significant first ("0x0000ffff,0xffffffff" or "00000000,0000ffff"). Empty words allowed.
  static std::optional<CpuSet> parse_mask(std::string_view text);

  std::string to_list() const;

  bool empty() const { return ids_.empty(); }
  std::size_t size() const { return ids_.size(); }
  bool contains(int id) const;
  bool contains_all(const CpuSet& other) const;
  bool intersects(const CpuSet& other) const;
  int first() const { return ids_.empty() ? -1 : ids_.front(); }
  const std::vector<int>& ids() const { return ids_; }

  CpuSet operator&(const CpuSet& other) const;  // intersection
  CpuSet operator|(const CpuSet& other) const;  // union
  CpuSet operator-(const CpuSet& other) const;  // difference

  bool operator==(const CpuSet&) const = default;
  auto operator<=>(const CpuSet&) const = default;

 private:
  std::vector<int> ids_;  // sorted, unique
};

}  // namespace topolaunch::topology
