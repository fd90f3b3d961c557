// server::HttpServer in this process, over real TLS on 127.0.0.1, with deadlines short enough to watch
// pass: what the programs' fixed timeouts (10 s to shake hands, 120 s idle) do, and how bodies and
// answers larger than one TLS record cross the connection; a start whose threads the system refuses, and the
// stop signals as the programs hold them around run(). And the TLS stream under it, on its own.
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cctype>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>

#include "files.hpp"
#include "gpuguard/cli/command_line.hpp"
#include "gpuguard/server/http_server.hpp"
#include "gpuguard/tls/server_context.hpp"
#include "server/tls_stream.hpp"
#include "server_process.hpp"
#include "tls_client.hpp"

using namespace gpuguard;
using namespace std::chrono_literals;

namespace {

// POST /echo answers with the body it got; GET /large answers with `large_answer`.
struct EchoHandler : server::Handler {
  std::string large_answer;
  std::optional<server::Response> reject_early(const server::RequestHead&) const override { return std::nullopt; }
  server::Response handle(const server::RequestHead& head, std::string body) const override {
    server::Response response;
    if (head.path == "/large") {
      response.body = large_answer;
    } else {
      response.body = std::move(body);
    }
    return response;
  }
};

// A server on its own thread for the length of a test, stopped and joined at the end.
class InProcessServer {
 public:
  InProcessServer(const EchoHandler& handler, server::ServerOptions options) {
    const std::string certs = GPUGUARD_TEST_CERTS_DIR;
    auto context = tls::make_server_context(test::read_file(certs + "/tls.crt"), test::read_file(certs + "/tls.key"),
                                            "tls.crt", "tls.key");
    options.listen_address = "127.0.0.1:0";
    server_ = std::make_unique<server::HttpServer>(
        std::move(options), [context] { return context; }, handler);
    const std::string address = server_->bind();
    port_ = static_cast<unsigned short>(std::stoi(address.substr(address.rfind(':') + 1)));
    thread_ = std::thread([this] { server_->run(); });
  }
  ~InProcessServer() {
    server_->stop();
    thread_.join();
  }
  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  unsigned short port() const { return port_; }

 private:
  std::unique_ptr<server::HttpServer> server_;
  unsigned short port_ = 0;
  std::thread thread_;
};

server::ServerOptions short_deadlines() {
  server::ServerOptions options;
  options.threads = 2;
  options.handshake_timeout = 300ms;
  options.idle_timeout = 300ms;
  options.request_timeout = 5s;
  options.shutdown_delay = 0ms;
  options.shutdown_timeout = 2s;
  return options;
}

// How long until the server closes a TCP connection that never says anything; nullopt if it is still
// open after `limit`.
std::optional<std::chrono::milliseconds> silent_connection_closed_after(unsigned short port,
                                                                        std::chrono::milliseconds limit) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  const auto started = std::chrono::steady_clock::now();
  pollfd readable{.fd = fd, .events = POLLIN, .revents = 0};
  std::optional<std::chrono::milliseconds> closed_after;
  if (::poll(&readable, 1, static_cast<int>(limit.count())) == 1) {
    char byte = 0;
    if (::read(fd, &byte, 1) == 0) {
      closed_after = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    }
  }
  ::close(fd);
  return closed_after;
}

// The tasks (processes and threads) whose real user is `uid`, as RLIMIT_NPROC counts them.
rlim_t tasks_of_user(uid_t uid) {
  rlim_t count = 0;
  const std::string wanted = "Uid:\t" + std::to_string(uid) + "\t";
  std::error_code ec;
  for (const auto& process : std::filesystem::directory_iterator("/proc", ec)) {
    if (!std::isdigit(static_cast<unsigned char>(process.path().filename().string()[0]))) continue;
    for (const auto& task : std::filesystem::directory_iterator(process.path() / "task", ec)) {
      std::ifstream status(task.path() / "status");
      for (std::string line; std::getline(status, line);) {
        if (line.starts_with("Uid:")) {
          count += line.starts_with(wanted) ? 1 : 0;
          break;
        }
      }
    }
  }
  return count;
}

}  // namespace

TEST_CASE("a connection that never shakes hands, or idles after a request, is closed at its deadline") {
  const EchoHandler handler;
  const InProcessServer server(handler, short_deadlines());

  const auto silent = silent_connection_closed_after(server.port(), 5s);
  REQUIRE(silent.has_value());
  CHECK(*silent >= 250ms);  // the handshake deadline, not at once
  CHECK(*silent < 3s);

  test::TlsClient client(server.port());
  CHECK(client.request("POST", "/echo", "hello").body == "hello");
  const auto started = std::chrono::steady_clock::now();
  const auto [received, closed] = client.read_until_closed(5s);
  CHECK(closed);
  CHECK(received.empty());
  CHECK(std::chrono::steady_clock::now() - started < 3s);
}

TEST_CASE("bodies and answers larger than a TLS record arrive whole, on one kept-alive connection") {
  EchoHandler handler;
  for (std::size_t i = 0; handler.large_answer.size() < std::size_t{300} * 1024; ++i) {
    handler.large_answer += "line " + std::to_string(i) + " of the large answer\n";
  }
  const InProcessServer server(handler, short_deadlines());
  test::TlsClient client(server.port());

  std::string body;
  for (int i = 0; body.size() < std::size_t{200} * 1024; ++i) body += static_cast<char>('a' + i % 26);
  for (int round = 0; round < 3; ++round) {
    const test::HttpReply echoed = client.request("POST", "/echo", body, "text/plain");
    CHECK(echoed.status == 200);
    CHECK(echoed.body == body);
    const test::HttpReply large = client.request("GET", "/large");
    CHECK(large.status == 200);
    CHECK(large.body == handler.large_answer);
  }
}

// What run() does when the system will not start all of its connections' threads (a pids limit reached, as
// in a pod at the kubelet's podPidsLimit): it throws, for the program to report why it cannot start, with the
// caller's signal mask as it was. It used to wait for ever, joining the threads it had started, whose loops
// it still held. Shown in a child process that may start one thread and not two: a user of its own, which no
// other process has (root may exceed the limit, so this needs root, as the enforcer's memory cgroup does), at
// RLIMIT_NPROC one above that user's tasks; the child says by its exit status what run() did.
TEST_CASE("a server whose connection threads cannot start throws, restores the signal mask, and never hangs") {
  INFO("run as root: the child takes a user of its own");
  REQUIRE(::geteuid() == 0);
  const EchoHandler handler;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      const uid_t own_id = test::own_test_user();
      if (::setgroups(0, nullptr) != 0 || ::setresgid(own_id, own_id, own_id) != 0 ||
          ::setresuid(own_id, own_id, own_id) != 0) {
        ::_exit(10);
      }
      const rlim_t one_more = tasks_of_user(own_id) + 1;
      const rlimit limit{one_more, one_more};
      if (::setrlimit(RLIMIT_NPROC, &limit) != 0) ::_exit(11);
      const sigset_t stop = cli::stop_signals();
      ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);     // as a program that released them calls run()
      server::ServerOptions options = short_deadlines();  // two connection loops: the second cannot start
      options.listen_address = "127.0.0.1:0";
      server::HttpServer server(options, server::TlsProvider{}, handler);
      server.bind();
      try {
        server.run();
      } catch (const std::system_error&) {
        sigset_t now;
        ::pthread_sigmask(SIG_BLOCK, nullptr, &now);
        ::_exit(sigismember(&now, SIGTERM) == 0 && sigismember(&now, SIGINT) == 0 ? 0 : 12);
      }
      ::_exit(14);  // returned as if served
    } catch (...) {
      ::_exit(13);  // never back into the test runner
    }
  }
  int status = 0;
  pid_t reaped = 0;
  for (int waited_ms = 0; reaped == 0 && waited_ms < 20000; waited_ms += 10) {
    reaped = ::waitpid(child, &status, WNOHANG);
    if (reaped == 0) std::this_thread::sleep_for(10ms);
  }
  if (reaped == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL("run() still ran 20 s after its threads could not start");
  }
  INFO(
      "the child's exit status (10, 11: could not set up; 12: mask left blocked; 13: another exception; 14: "
      "run() returned)");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// cli::StopSignalsHeld as every program holds the stop signals around its server's run(): blocked from
// construction, unblocked in this thread while release()'s result lives, and blocked again once it goes, which
// is before the server goes: a stop that comes as a failed run() unwinds waits, pending, while the program
// says why it cannot start. (Unblocked there, a SIGTERM sent to the webhook just then, under ASan, found the
// server's handler gone and ended it by signal 15.)
TEST_CASE("the stop signals are held before the release, delivered while it lives, and held again after") {
  const auto blocked = [](int signal) {
    sigset_t now;
    ::pthread_sigmask(SIG_BLOCK, nullptr, &now);
    return sigismember(&now, signal) == 1;
  };
  const sigset_t stop = cli::stop_signals();
  ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
  const cli::StopSignalsHeld held;
  CHECK(blocked(SIGTERM));
  CHECK(blocked(SIGINT));
  {
    const auto delivered = held.release();
    CHECK_FALSE(blocked(SIGTERM));
    CHECK_FALSE(blocked(SIGINT));
  }
  CHECK(blocked(SIGTERM));
  CHECK(blocked(SIGINT));
}

// A deadline or the drain closes a socket while its TLS session still exists, and the descriptor's number
// goes at once to the next socket opened, on any loop. What the old session does next (the read that was
// pending, its close_notify) must not reach that socket.
TEST_CASE("a TLS stream whose socket was closed never reads or writes the descriptor's next owner") {
  const std::string certs = GPUGUARD_TEST_CERTS_DIR;
  const auto context = tls::make_server_context(test::read_file(certs + "/tls.crt"),
                                                test::read_file(certs + "/tls.key"), "tls.crt", "tls.key");
  using Executor = boost::asio::io_context::executor_type;
  boost::asio::io_context loop(1);
  int first[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, first) == 0);
  boost::asio::basic_stream_socket<boost::asio::ip::tcp, Executor> socket(loop);
  socket.assign(boost::asio::ip::tcp::v4(), first[0]);
  server::TlsStream<Executor> stream(socket, context->native_handle());

  socket.close();  // as the deadline does
  int second[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, second) == 0);
  REQUIRE(second[0] == first[0]);  // the lowest free number: the closed one
  REQUIRE(::write(second[1], "stranger", 8) == 8);

  char buffer[64];
  boost::system::error_code read_error, shutdown_error;
  stream.async_read_some(boost::asio::buffer(buffer),
                         [&](boost::system::error_code ec, std::size_t) { read_error = ec; });
  loop.run();
  loop.restart();
  stream.async_shutdown([&](boost::system::error_code ec, std::size_t) { shutdown_error = ec; });
  loop.run();
  CHECK(read_error);
  CHECK(shutdown_error);
  CHECK(::recv(second[0], buffer, sizeof buffer, MSG_DONTWAIT) == 8);   // still there, unread
  CHECK(::recv(second[1], buffer, sizeof buffer, MSG_DONTWAIT) == -1);  // nothing was written to it
  for (const int fd : {first[1], second[0], second[1]}) ::close(fd);
}
