// The agent's Prometheus endpoint: the text format of a snapshot, and a real server on loopback
// answering GET /metrics with it (and 404 elsewhere).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "catch.hpp"
#include "metrics_server.hpp"

using namespace topolaunch::launcher;

namespace {

MetricsSnapshot two_ranks() {
  MetricsSnapshot s;
  s.job = "tiny-\"1\"";
  s.node = "vm";
  s.restarts = 1;
  for (int r = 0; r < 2; ++r) {
    RankMetrics m;
    m.rank = r;
    m.running = true;
    m.step = 40 + r;
    m.loss = 2.5;
    m.has_step_figures = true;
    m.tokens_per_s = 1000;
    m.step_s = 0.25;
    m.part_s[0] = 0.2;
    m.host_bytes = 1 << 20;
    m.comm_bytes_total = 4096;
    m.comm_exposed_s_total = 1.5;
    m.heartbeat_age_s = 0.125;
    s.ranks.push_back(m);
  }
  return s;
}

std::string get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
    reply.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return reply;
}

}  // namespace

TEST_CASE("metrics: every series with job, node and rank labels, label values escaped") {
  const std::string text = render_prometheus(two_ranks(), 7);
  CHECK(text.find("# TYPE topolaunch_step gauge\n") != std::string::npos);
  CHECK(text.find("topolaunch_step{job=\"tiny-\\\"1\\\"\",node=\"vm\",rank=\"1\"} 41\n") !=
        std::string::npos);
  CHECK(text.find("topolaunch_loss{job=\"tiny-\\\"1\\\"\",node=\"vm\",rank=\"0\"} 2.5\n") !=
        std::string::npos);
  CHECK(text.find("topolaunch_step_part_seconds{job=\"tiny-\\\"1\\\"\",node=\"vm\",rank=\"0\","
                  "part=\"compute\"} 0.2\n") != std::string::npos);
  CHECK(text.find(",kind=\"host\"} 1048576\n") != std::string::npos);
  CHECK(text.find("# TYPE topolaunch_comm_bytes_total counter\n") != std::string::npos);
  CHECK(text.find("topolaunch_comm_exposed_seconds_total{job=\"tiny-\\\"1\\\"\",node=\"vm\","
                  "rank=\"0\"} 1.5\n") != std::string::npos);
  CHECK(text.find("topolaunch_heartbeat_age_seconds{") != std::string::npos);
  CHECK(text.find("topolaunch_restarts_total{job=\"tiny-\\\"1\\\"\",node=\"vm\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("topolaunch_scrapes_total{job=\"tiny-\\\"1\\\"\",node=\"vm\"} 7\n") !=
        std::string::npos);
  MetricsSnapshot none = two_ranks();
  for (auto& r : none.ranks) {
    r.loss.reset();
    r.has_step_figures = false;
  }
  const std::string bare = render_prometheus(none, 0);
  CHECK(bare.find("topolaunch_loss{") == std::string::npos);  // no value, no series
  CHECK(bare.find("topolaunch_tokens_per_second{") == std::string::npos);
  CHECK(bare.find("topolaunch_step{") != std::string::npos);
}

TEST_CASE("metrics: a server on loopback answers /metrics and counts; a port in use is refused") {
  auto server = MetricsServer::start(0 + 19477);
  REQUIRE(server.ok());
  (*server)->publish(two_ranks());
  const std::string reply = get(19477, "/metrics");
  CHECK(reply.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(reply.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(reply.find("topolaunch_step{job=") != std::string::npos);
  CHECK(get(19477, "/other").rfind("HTTP/1.1 404", 0) == 0);
  CHECK((*server)->scrapes() == 1);
  auto second = MetricsServer::start(19477);
  REQUIRE_FALSE(second.ok());
  CHECK(second.error().exit_code == 2);
  CHECK(second.error().message == "port 19477 is not free (Address already in use)");
}
