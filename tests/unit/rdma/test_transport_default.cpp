// Transport::allocate_memory's default (what a transport without its own allocator gets): the
// memory is registered, the handle still points at the registration, and the registration is
// released before the memory it covers.
#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "topolaunch/rdma/endpoint.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;

namespace {

struct Registration {
  void* address;
  std::vector<std::string>* events;
};

class FakeTransport final : public Transport {
 public:
  explicit FakeTransport(std::vector<std::string>* events) : events_(events) {}
  std::string kind() const override { return "fake"; }
  std::string description() const override { return "fake"; }
  Result<std::string> local_blob(int) override { return std::string(); }
  Status connect(int, std::string_view) override { return ok_status(); }
  Result<LocalMemory> register_memory(void* address, std::size_t bytes, MemoryKind kind) override {
    auto* r = new Registration{address, events_};
    std::shared_ptr<void> handle(r, [](void* p) {
      auto* reg = static_cast<Registration*>(p);
      // The memory must still be there: write to it as a deregistration might touch it.
      static_cast<volatile char*>(reg->address)[0] = 1;
      reg->events->push_back("deregistered");
      delete reg;
    });
    return LocalMemory{address, bytes, kind, "key", handle};
  }
  Status write(int, const LocalMemory&, std::size_t, const RemoteMemory&, std::size_t,
               std::size_t) override {
    return ok_status();
  }
  Status flush(int, std::chrono::milliseconds) override { return ok_status(); }
  void progress() override {}

 private:
  std::vector<std::string>* events_;
};

}  // namespace

TEST_CASE("allocate_memory's default: page-aligned, registered, handle = the registration") {
  std::vector<std::string> events;
  FakeTransport t(&events);
  {
    auto m = t.allocate_memory(10000);
    REQUIRE(m.ok());
    CHECK(m->bytes == 10000);
    CHECK(reinterpret_cast<std::uintptr_t>(m->address) % 4096 == 0);
    CHECK(m->packed_key == "key");
    REQUIRE(m->handle);
    auto* reg = static_cast<Registration*>(m->handle.get());
    CHECK(reg->address == m->address);  // a transport can read its registration from the handle
    static_cast<char*>(m->address)[9999] = 7;  // all of it is usable
    CHECK(events.empty());
  }
  CHECK(events == std::vector<std::string>{"deregistered"});  // once, memory still valid then
}
