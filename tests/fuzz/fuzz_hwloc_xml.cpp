// hwloc XML as topodiag --input, topolaunch map --topology and the plugin's topology_xml read it:
// topology::load_xml_buffer with hwloc's minimal importer (as the programs choose at the top of
// main), then what the rank map reads of the result.
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/serialize.hpp"

using namespace topolaunch;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  topology::prefer_minimal_xml_importer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string xml(reinterpret_cast<const char*>(data), size);
  auto node = topology::load_xml_buffer(xml, "fuzz.xml");
  if (!node) {
    fuzz::require(node.error().exit_code == 2, "a refused topology must exit 2",
                  node.error().message);
    fuzz::require_one_line(node.error().message);
    return 0;
  }
  // Our own JSON form of what was read, and back: the same text.
  const std::string json = topology::to_json(*node);
  auto back = topology::from_json(json, "fuzz.json");
  fuzz::require(back.ok(), "the JSON form of a loaded topology does not read back",
                back ? std::string_view{} : std::string_view(back.error().message));
  fuzz::require(topology::to_json(*back) == json, "JSON round trip changed the topology", json);
  return 0;
}
