// The agent's Prometheus endpoint; see metrics_server.hpp.
#include "metrics_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "topolaunch/launcher/cost.hpp"

namespace topolaunch::launcher {

namespace {

std::string label_value(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

class Family {
 public:
  Family(std::string& out, const char* name, const char* type, const char* help)
      : out_(out), name_(name) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& labels, double value) {
    out_ += fmt::format("{}{{{}}} {}\n", name_, labels, value);
  }

 private:
  std::string& out_;
  const char* name_;
};

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

std::string render_prometheus(const MetricsSnapshot& s, std::uint64_t scrapes) {
  std::string out;
  const std::string node_labels =
      fmt::format("job=\"{}\",node=\"{}\"", label_value(s.job), label_value(s.node));
  auto rank_labels = [&](const RankMetrics& r) {
    return fmt::format("{},rank=\"{}\"", node_labels, r.rank);
  };
  {
    Family f(out, "topolaunch_rank_running", "gauge", "1 while the rank's worker runs.");
    for (const RankMetrics& r : s.ranks) f.sample(rank_labels(r), r.running ? 1 : 0);
  }
  {
    Family f(out, "topolaunch_step", "gauge",
             "The last optimizer step the rank finished (its heartbeat counter).");
    for (const RankMetrics& r : s.ranks) f.sample(rank_labels(r), static_cast<double>(r.step));
  }
  {
    Family f(out, "topolaunch_loss", "gauge",
             "The ranks' mean training loss at the last logged step.");
    for (const RankMetrics& r : s.ranks)
      if (r.loss) f.sample(rank_labels(r), *r.loss);
  }
  {
    Family f(out, "topolaunch_tokens_per_second", "gauge",
             "The rank's tokens per second over the last interval of its step figures.");
    for (const RankMetrics& r : s.ranks)
      if (r.has_step_figures) f.sample(rank_labels(r), r.tokens_per_s);
  }
  {
    Family f(out, "topolaunch_step_seconds", "gauge",
             "Wall time per step over the last interval of the rank's step figures.");
    for (const RankMetrics& r : s.ranks)
      if (r.has_step_figures) f.sample(rank_labels(r), r.step_s);
  }
  {
    Family f(out, "topolaunch_step_part_seconds", "gauge",
             "The parts of a step over the last interval: compute, exposed communication, data "
             "input, checkpoint I/O, idle, tracing, validation (seconds per step).");
    for (const RankMetrics& r : s.ranks) {
      if (!r.has_step_figures) continue;
      for (std::size_t p = 0; p < std::size(kStepPartNames); ++p)
        f.sample(fmt::format("{},part=\"{}\"", rank_labels(r), kStepPartNames[p]), r.part_s[p]);
    }
  }
  {
    Family f(out, "topolaunch_memory_bytes", "gauge",
             "The rank's memory now: host (RSS, or PSS of its process tree) and GPU (NVML).");
    for (const RankMetrics& r : s.ranks) {
      f.sample(rank_labels(r) + ",kind=\"host\"", static_cast<double>(r.host_bytes));
      f.sample(rank_labels(r) + ",kind=\"gpu\"", static_cast<double>(r.gpu_bytes));
    }
  }
  {
    Family f(out, "topolaunch_comm_bytes_total", "counter",
             "Gradient bytes the rank all-reduced (the buckets' payload).");
    for (const RankMetrics& r : s.ranks)
      if (r.has_step_figures) f.sample(rank_labels(r), static_cast<double>(r.comm_bytes_total));
  }
  {
    Family f(out, "topolaunch_comm_exposed_seconds_total", "counter",
             "Time the rank's steps waited for gradient communication.");
    for (const RankMetrics& r : s.ranks)
      if (r.has_step_figures) f.sample(rank_labels(r), r.comm_exposed_s_total);
  }
  {
    Family f(out, "topolaunch_heartbeat_age_seconds", "gauge",
             "Seconds since the rank last wrote its heartbeat file.");
    for (const RankMetrics& r : s.ranks)
      if (r.heartbeat_age_s) f.sample(rank_labels(r), *r.heartbeat_age_s);
  }
  {
    Family f(out, "topolaunch_restarts_total", "counter", "Restarts of the job so far.");
    f.sample(node_labels, s.restarts);
  }
  {
    Family f(out, "topolaunch_scrapes_total", "counter", "Scrapes this endpoint has answered.");
    f.sample(node_labels, static_cast<double>(scrapes));
  }
  return out;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(int port) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0)
    return make_error(fmt::format("port {}: socket: {}", port, std::strerror(errno)), 1);
  const int one = 1;
  ::setsockopt(server->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(server->listen_fd_, 64) != 0)
    return make_error(fmt::format("port {} is not free ({})", port, std::strerror(errno)), 2);
  server->port_ = port;
  if (::pipe2(server->wake_, O_CLOEXEC) != 0)
    return make_error(fmt::format("port {}: pipe: {}", port, std::strerror(errno)), 1);
  server->thread_ = std::thread([s = server.get()] { s->serve(); });
  return server;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!::write(wake_[1], &byte, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) ::close(fd);
}

void MetricsServer::publish(MetricsSnapshot snapshot) {
  std::lock_guard<std::mutex> lock(mutex_);
  snapshot_ = std::move(snapshot);
}

void MetricsServer::serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      answer(client);
      ::close(client);
    }
  }
}

// One request per connection: read its head (up to 8 KiB, at most a second), answer, close.
void MetricsServer::answer(int client) {
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
    pollfd p{client, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) return;
    const ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<std::size_t>(n));
  }
  const bool metrics = request.rfind("GET /metrics ", 0) == 0 ||
                       request.rfind("GET /metrics?", 0) == 0 || request.rfind("GET / ", 0) == 0;
  if (!metrics) {
    write_all(client,
              "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 22\r\n"
              "Connection: close\r\n\r\nonly /metrics is here\n");
    return;
  }
  MetricsSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot = snapshot_;
  }
  const std::string body = render_prometheus(snapshot, ++scrapes_);
  write_all(client, fmt::format("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; "
                                "charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                                body.size()) +
                        body);
}

}  // namespace topolaunch::launcher
