// gpuguard_attack PORT SECONDS [ATTACK,...]: every client-held resource attack of issue 24 at once against a server on
// 127.0.0.1:PORT, for SECONDS, for bench/attack_soak.sh. Each attacker starts over as soon as the server
// closes on it (the held bodies a second later, the idle connections at a steady rate). It checks nothing itself: the
// soak judges the server by the load's throughput and latency and by the server's RSS. Prints how often each attack was
// carried out.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

int connect_tcp(unsigned short port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One TLS 1.3 connection, or none when the server refused it.
struct Tls {
  explicit Tls(SSL_CTX* context, unsigned short port) : fd(connect_tcp(port)) {
    if (fd < 0) return;
    ssl = SSL_new(context);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
      SSL_free(ssl);
      ssl = nullptr;
    }
  }
  ~Tls() {
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) ::close(fd);
  }
  Tls(const Tls&) = delete;
  Tls& operator=(const Tls&) = delete;
  bool write(const std::string& bytes) {
    return ssl != nullptr && SSL_write(ssl, bytes.data(), static_cast<int>(bytes.size())) > 0;
  }
  int fd;
  SSL* ssl = nullptr;
};

const std::string kChunkedHead =
    "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

std::string post_head(std::size_t length) {
  return "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(length) + "\r\n\r\n";
}

struct Attack {
  Attack(const char* n, std::function<void()> o, std::chrono::milliseconds p = 10ms)
      : name(n), once(std::move(o)), pause(p) {}
  const char* name;
  std::function<void()> once;       // one attempt, until the server closes on it
  std::chrono::milliseconds pause;  // before the next attempt
  std::atomic<long> count{0};
};

// Each attack (those in `only`, ",name,...,", when it is not empty) on a thread of its own until `until`;
// how many times each ran, by name.
std::map<std::string, long> run_attacks(std::deque<Attack>& attacks, const std::string& only, Clock::time_point until) {
  std::vector<std::thread> threads;
  for (auto& attack : attacks) {
    if (!only.empty() && only.find(std::string(",") + attack.name + ",") == std::string::npos) continue;
    threads.emplace_back([&attack, until] {
      while (Clock::now() < until) {
        attack.once();
        ++attack.count;
        std::this_thread::sleep_for(attack.pause);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::map<std::string, long> totals;
  for (const auto& attack : attacks) totals[attack.name] += attack.count;
  return totals;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: gpuguard_attack PORT SECONDS [ATTACK,...]\n");
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  const auto port = static_cast<unsigned short>(std::atoi(argv[1]));
  const auto until = Clock::now() + std::chrono::seconds(std::atoi(argv[2]));
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(context, TLS1_3_VERSION);
  const std::string line(std::size_t{256} * 1024, 'x');

  std::deque<Attack> attacks;
  attacks.emplace_back("keyupdate-flood", [&] {
    Tls tls(context, port);
    if (tls.ssl == nullptr) return;
    while (SSL_key_update(tls.ssl, SSL_KEY_UPDATE_NOT_REQUESTED) == 1 && SSL_do_handshake(tls.ssl) == 1) {
    }
  });
  for (const auto& endless :
       {std::pair{"endless-chunk-extension", std::string("2;")}, std::pair{"endless-chunk-size", std::string("0")},
        std::pair{"endless-trailer", std::string("0\r\nX-Trailer: ")}}) {
    attacks.emplace_back(endless.first, [&, tail = endless.second] {
      Tls tls(context, port);
      if (!tls.write(kChunkedHead + tail)) return;
      const std::string& filler = tail == "0" ? std::string(line.size(), '0') : line;
      for (int i = 0; i < 64 && tls.write(filler); ++i) {
      }
    });
  }
  // 40 connections holding all but the last KiB of a 4 MiB body, each for up to 2 s (its receive timeout),
  // and opened again a second after the server closed it (the Retry-After of its 503). Retried at once,
  // they would be a flood of TLS handshakes, which costs CPU and holds nothing.
  for (int i = 0; i < 40; ++i) {
    attacks.emplace_back(
        "held-bodies",
        [&] {
          Tls tls(context, port);
          const std::size_t length = std::size_t{4} << 20;
          if (!tls.write(post_head(length))) return;
          std::string body(length - 1024, ' ');
          if (!tls.write(body)) return;
          char answer[512];
          SSL_read(tls.ssl, answer, sizeof answer);  // 503 at once, or the receive timeout
        },
        1000ms);
  }
  // Connections that never say anything, 8,000 held at a time, the oldest replaced; opened at 1,000 a
  // second (issue 24 measured 8,000 in 12.9 s). Opened as fast as the kernel allows, they would be a
  // flood of accepts, which costs CPU rather than holding anything.
  std::atomic<long> opened{0};
  attacks.emplace_back("idle-connections", [&] {
    std::deque<int> held;
    auto next = Clock::now();
    while (Clock::now() < until) {
      std::this_thread::sleep_until(next);
      next += 1ms;
      const int fd = connect_tcp(port);
      if (fd >= 0) {
        held.push_back(fd);
        ++opened;
      }
      if (held.size() > 8000 || (fd < 0 && !held.empty())) {
        ::close(held.front());
        held.pop_front();
      }
    }
    for (const int fd : held) ::close(fd);
  });

  // Only the attacks named, when a list is given (to see what each costs on its own).
  const std::string only = argc == 4 ? std::string(",") + argv[3] + "," : std::string();
  for (const auto& [name, count] : run_attacks(attacks, only, until)) std::printf("%s: %ld\n", name.c_str(), count);
  std::printf("idle connections opened: %ld\n", opened.load());
  SSL_CTX_free(context);
  return 0;
}
