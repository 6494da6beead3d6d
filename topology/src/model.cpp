#include "topolaunch/topology/model.hpp"

#include <fmt/format.h>
#include <charconv>

namespace topolaunch::topology {

namespace {

template <class T>
std::optional<T> parse_hex(std::string_view s, std::size_t max_digits) {
  if (s.empty() || s.size() > max_digits) {
    return std::nullopt;
  }
  T value{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value, 16);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

std::string PciAddress::to_string() const {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, device, function);
}

std::optional<PciAddress> PciAddress::parse(std::string_view text) {
  // [domain:]bus:device.function, hex digits of either case.
  PciAddress out;
  auto dot = text.rfind('.');
  if (dot == std::string_view::npos) {
    return std::nullopt;
  }
  auto function = parse_hex<std::uint32_t>(text.substr(dot + 1), 1);
  std::string_view head = text.substr(0, dot);
  auto last_colon = head.rfind(':');
  if (!function || *function > 7 || last_colon == std::string_view::npos) {
    return std::nullopt;
  }
  auto device = parse_hex<std::uint32_t>(head.substr(last_colon + 1), 2);
  head = head.substr(0, last_colon);
  auto colon = head.rfind(':');
  auto bus =
      parse_hex<std::uint32_t>(head.substr(colon == std::string_view::npos ? 0 : colon + 1), 2);
  if (!device || *device > 0x1f || !bus) {
    return std::nullopt;
  }
  if (colon != std::string_view::npos) {
    auto domain = parse_hex<std::uint32_t>(head.substr(0, colon), 8);
    if (!domain) {
      return std::nullopt;
    }
    out.domain = *domain;
  }
  out.bus = static_cast<std::uint8_t>(*bus);
  out.device = static_cast<std::uint8_t>(*device);
  out.function = static_cast<std::uint8_t>(*function);
  return out;
}

std::size_t NodeTopology::pu_count() const {
  std::size_t count = 0;
  for (const Core& core : cores) {
    count += core.pus.size();
  }
  return count;
}

const NumaNode* NodeTopology::numa(int os_index) const {
  for (const NumaNode& node : numa_nodes) {
    if (node.os_index == os_index) {
      return &node;
    }
  }
  return nullptr;
}

const Gpu* NodeTopology::gpu_by_busid(const PciAddress& busid) const {
  for (const Gpu& gpu : gpus) {
    if (gpu.busid == busid) {
      return &gpu;
    }
  }
  return nullptr;
}

const Nic* NodeTopology::nic_by_name(std::string_view name) const {
  for (const Nic& nic : nics) {
    if (nic.name == name) {
      return &nic;
    }
  }
  return nullptr;
}

std::string_view to_string(NicRole role) {
  switch (role) {
    case NicRole::compute:
      return "compute";
    case NicRole::storage:
      return "storage";
    case NicRole::excluded:
      return "excluded";
  }
  return "compute";
}

std::optional<NicRole> nic_role_from_string(std::string_view text) {
  if (text == "compute") return NicRole::compute;
  if (text == "storage") return NicRole::storage;
  if (text == "excluded") return NicRole::excluded;
  return std::nullopt;
}

bool natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      std::string_view na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return (a.size() - i) < (b.size() - j);
}

}  // namespace topolaunch::topology
