// topolaunch-store: the TCP wireup store as its own process (the agent can also host it in a
// thread, see tcp_store.hpp).
//
//   TOPOLAUNCH_STORE_SECRET=... topolaunch-store [--host 127.0.0.1] [--port 0] [--world-size N]
//
// The secret comes from the environment, never argv (argv is visible to every user in ps).
// Prints the address (host:port, the value for TOPOLAUNCH_STORE_ADDR) on stdout once listening,
// then serves until SIGINT or SIGTERM. Bad usage or a port in use: exit 2 with one line.
#include <signal.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "topolaunch/wireup/tcp_store.hpp"

namespace {

int usage_error(const std::string& message) {
  std::fprintf(stderr, "topolaunch-store: %s\n", message.c_str());
  return 2;
}

template <class Int>
bool parse_int(std::string_view text, Int& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace topolaunch::wireup;
  TcpStoreServerOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: TOPOLAUNCH_STORE_SECRET=... topolaunch-store [--host H] [--port P] [--world-size "
          "N]\n");
      return 0;
    }
    if (i + 1 >= argc) return usage_error(std::string(arg) + ": missing value (see --help)");
    std::string_view value = argv[++i];
    if (arg == "--host") {
      options.bind_host = std::string(value);
    } else if (arg == "--port") {
      if (!parse_int(value, options.port))
        return usage_error("--port " + std::string(value) + ": not a port number");
    } else if (arg == "--world-size") {
      if (!parse_int(value, options.world_size) || options.world_size < 1) {
        return usage_error("--world-size " + std::string(value) + ": not a positive integer");
      }
    } else {
      return usage_error("unknown option " + std::string(arg) + " (see --help)");
    }
  }
  const char* secret = std::getenv(kStoreSecretEnv);
  if (secret == nullptr || *secret == '\0') {
    return usage_error(std::string(kStoreSecretEnv) +
                       " is not set: the store needs the job's secret");
  }
  options.secret = secret;

  // Block the stop signals before the serving thread starts, so only sigwait() sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = TcpStoreServer::start(options);
  if (!server) return usage_error(server.error().message);
  std::printf("%s\n", (*server)->address().c_str());
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  (*server)->stop();
  return 0;
}
