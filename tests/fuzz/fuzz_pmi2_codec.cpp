// PMI2's KVS holds text a peer wrote: the codec that carries binary values through it. Input:
// byte 0 picks the limits, then a value split into key/value entries, joined back (a round trip
// that must be exact), and the same bytes read as a hostile KVS would hand them over: a head
// value and its chunks ("<head>\n<chunk 1>\n<chunk 2>...").
#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "pmi2_codec.hpp"

using namespace topolaunch;
using namespace topolaunch::wireup;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t limits = data[0];
  const std::span<const std::byte> value(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  // Round trip of encoding and of splitting (small limits make many chunks).
  const std::string encoded = pmi2::base64url_encode(value);
  auto decoded = pmi2::base64url_decode(encoded);
  fuzz::require(decoded.ok() && decoded->size() == value.size() &&
                    std::equal(value.begin(), value.end(), decoded->begin()),
                "base64url round trip", encoded);
  const std::size_t max_key = 8 + (limits & 0x3f);
  const std::size_t max_value = 10 + (limits >> 2) * 4;
  auto entries = pmi2::split_value("k", value, max_key, max_value);
  if (entries) {
    std::map<std::string, std::string> kvs;
    for (const auto& e : *entries) {
      fuzz::require(e.key.size() <= max_key && e.value.size() <= max_value,
                    "split_value broke the limits", e.key);
      kvs[e.key] = e.value;
    }
    auto joined =
        pmi2::join_value("k", kvs["k"], [&](const std::string& key) -> Result<std::string> {
          auto it = kvs.find(key);
          if (it == kvs.end()) return make_error("missing " + key);
          return it->second;
        });
    fuzz::require(joined.ok() && joined->size() == value.size() &&
                      std::equal(value.begin(), value.end(), joined->begin()),
                  "split/join round trip");
  } else {
    fuzz::require_one_line(entries.error().message);
  }

  // What a peer could have put in the KVS.
  if (auto raw = pmi2::base64url_decode(text); !raw) fuzz::require_one_line(raw.error().message);
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const auto nl = text.find('\n', start);
    parts.emplace_back(text.substr(start, nl == std::string_view::npos ? nl : nl - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  std::size_t fetched = 0;
  auto joined = pmi2::join_value("k", parts[0], [&](const std::string& key) -> Result<std::string> {
    // A KVS holds a key or not; past the parts given, the key is missing.
    ++fetched;
    const auto hash = key.rfind('#');
    const std::size_t index = std::stoul(key.substr(hash + 1));
    if (index >= parts.size()) return make_error("pmi2: key '" + key + "' not found");
    return parts[index];
  });
  fuzz::require(fetched <= parts.size(), "join_value asked for chunks past a missing one");
  if (!joined) fuzz::require_one_line(joined.error().message);
  return 0;
}
