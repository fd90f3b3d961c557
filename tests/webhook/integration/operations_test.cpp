// Issue-3 operations against the real binary: policy hot reload from a kubelet-style ConfigMap volume,
// certificate rotation and SIGTERM drain under continuous requests, and the /metrics scrape.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "eventually.hpp"
#include "files.hpp"
#include "promtool.hpp"
#include "server_process.hpp"
#include "tls_client.hpp"

using namespace gpuguard::test;
using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A directory laid out as the kubelet lays out a mounted ConfigMap or Secret: the files live in a
// timestamped directory, `..data` points at it and is swapped atomically, and each key is a symlink
// `KEY -> ..data/KEY`.
class KubeletVolume {
 public:
  explicit KubeletVolume(const std::string& name)
      : dir_(fs::temp_directory_path() / ("gpuguard-" + name + std::string("-").append(std::to_string(::getpid())))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~KubeletVolume() { fs::remove_all(dir_); }

  const fs::path& dir() const { return dir_; }

  void publish(const std::map<std::string, std::string>& files) {
    const fs::path generation = dir_ / (std::string("..2026_11_22_10_00_00.").append(std::to_string(++generation_)));
    fs::create_directories(generation);
    for (const auto& [key, content] : files) {
      std::ofstream(generation / key, std::ios::binary) << content;
      if (!fs::is_symlink(dir_ / key)) fs::create_directory_symlink(fs::path("..data") / key, dir_ / key);
    }
    fs::create_directory_symlink(generation.filename(), dir_ / "..data_tmp");
    fs::rename(dir_ / "..data_tmp", dir_ / "..data");  // the atomic swap
    if (!previous_.empty()) fs::remove_all(previous_);
    previous_ = generation;
  }

 private:
  fs::path dir_;
  fs::path previous_;
  int generation_ = 0;
};

std::string fixture_review(const std::string& name) {
  return read_file(fixtures_dir() / "admission" / name / "review.json");
}

bool is_patched(const HttpReply& reply) { return json::parse(reply.body)["response"].contains("patch"); }

std::string scrape(unsigned short port) { return TlsClient(port).request("GET", "/metrics").body; }

// Waits up to `limit` for `condition`; how long it took, for the test's report.
std::optional<std::chrono::milliseconds> wait_for(std::chrono::milliseconds limit,
                                                  const std::function<bool()>& condition) {
  const auto start = std::chrono::steady_clock::now();
  if (!eventually(condition, limit)) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
}

}  // namespace

TEST_CASE("policy: a kubelet-style ..data swap takes effect within 5 s, and an invalid one is refused") {
  KubeletVolume volume("policy");
  volume.publish({{"mode", "enforce\n"}, {"colour", "blue"}});
  WebhookProcess webhook({"--policy-dir", volume.dir().string()});
  TlsClient client(webhook.port());
  const std::string body = fixture_review("user-all");
  REQUIRE(is_patched(client.request("POST", "/mutate", body)));
  CHECK_THAT(scrape(webhook.port()), Catch::Contains("gpuguard_policy_info{mode=\"enforce\"} 1"));

  volume.publish({{"mode", "off\n"}});
  const auto took = wait_for(5s, [&] { return !is_patched(client.request("POST", "/mutate", body)); });
  REQUIRE(took.has_value());
  INFO("took " << took->count() << " ms");
  const std::string after_swap = scrape(webhook.port());
  CHECK_THAT(after_swap, Catch::Contains("gpuguard_policy_info{mode=\"off\"} 1"));
  CHECK_THAT(after_swap, Catch::Contains("gpuguard_policy_reloads_total{result=\"success\"} 1"));

  volume.publish({{"mode", "enforce"}, {"privileged", "sometimes"}});
  REQUIRE(wait_for(5s, [&] {
    return scrape(webhook.port()).find("gpuguard_policy_reloads_total{result=\"failure\"} 1") != std::string::npos;
  }));
  CHECK_FALSE(is_patched(client.request("POST", "/mutate", body)));  // still mode off: the last good policy

  volume.publish({{"mode", "strict"}});
  REQUIRE(wait_for(
      5s, [&] { return json::parse(client.request("POST", "/mutate", body).body)["response"]["allowed"] == false; }));
  CHECK(webhook.terminate() == 0);
}

TEST_CASE("policy: starting with an invalid policy exits non-zero and names the key") {
  KubeletVolume volume("bad-policy");
  volume.publish({{"visibleDevicesValue", "all"}});
  const ExitResult result =
      run_webhook("--tls-cert-file " + certs_dir() + "/tls.crt --tls-private-key-file " + certs_dir() +
                  "/tls.key --listen-address 127.0.0.1:0 --policy-dir " + volume.dir().string());
  CHECK(result.status == 1);
  CHECK_THAT(result.output, Catch::Contains("policy key visibleDevicesValue"));
}

TEST_CASE("metrics: the scrape has every series, and counts what was served") {
  WebhookProcess webhook;
  TlsClient client(webhook.port());
  for (int i = 0; i < 3; ++i) REQUIRE(client.request("POST", "/mutate", fixture_review("mixed")).status == 200);
  REQUIRE(client.request("POST", "/mutate", fixture_review("delete")).status == 200);
  REQUIRE(client.request("POST", "/mutate", fixture_review("host-mount-dev-dir")).status == 200);
  REQUIRE(client.request("POST", "/mutate", "{}").status == 400);
  const HttpReply reply = client.request("GET", "/metrics");
  REQUIRE(reply.status == 200);
  CHECK_THAT(reply.headers.at("content-type"), Catch::StartsWith("text/plain; version=0.0.4"));
  const std::string& text = reply.body;
  check_promtool_clean(text);
  for (const char* expected : {
           "gpuguard_admission_requests_total{operation=\"CREATE\",result=\"patched\"} 3",
           "gpuguard_admission_requests_total{operation=\"CREATE\",result=\"allowed\"} 1",
           "gpuguard_admission_requests_total{operation=\"DELETE\",result=\"allowed\"} 1",
           "gpuguard_admission_requests_total{operation=\"unknown\",result=\"invalid\"} 1",
           "# TYPE gpuguard_admission_duration_seconds histogram",
           "gpuguard_admission_duration_seconds_bucket{le=\"5.0000000000000002e-05\"}",
           "gpuguard_admission_duration_seconds_bucket{le=\"1\"} 6",
           "gpuguard_admission_duration_seconds_count 6",
           "gpuguard_containers_mutated_total{reason=\"injected\"} 6",
           "gpuguard_containers_mutated_total{reason=\"replaced\"} 3",
           "gpuguard_containers_mutated_total{reason=\"stripped\"} 3",
           "gpuguard_doors_total{door=\"host_device_mounts\",action=\"warn\"} 1",
           "gpuguard_doors_total{door=\"privileged\",action=\"warn\"} 0",
           "gpuguard_policy_reloads_total{result=\"success\"} 0",
           "gpuguard_policy_info{mode=\"enforce\"} 1",
           "gpuguard_tls_certificate_expiry_timestamp_seconds ",
           "gpuguard_tls_certificate_reloads_total{result=\"failure\"} 0",
           "gpuguard_build_info{version=\"",
       }) {
    CHECK_THAT(text, Catch::Contains(expected));
  }
  // The expiry is the certificate's notAfter, a year or so ahead.
  const std::string sample = "\ngpuguard_tls_certificate_expiry_timestamp_seconds ";
  const std::size_t at = text.find(sample);
  REQUIRE(at != std::string::npos);
  const double expiry = std::stod(text.substr(at + sample.size()));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(expiry > now + 300 * 86400.0);
  CHECK(expiry < now + 400 * 86400.0);
}

namespace {

// Continuous requests from several threads until stopped. Each thread reconnects when the server says
// Connection: close; `fresh_connections` makes every request a new TLS handshake.
class Load {
 public:
  Load(unsigned short port, int threads, bool fresh_connections) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, port, fresh_connections] { run(port, fresh_connections); });
    }
  }
  ~Load() { stop(); }

  void stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  // Connections refused once draining has begun are not failures: no request was accepted.
  void draining() { draining_ = true; }

  std::atomic<int> ok{0}, failed{0}, refused{0}, closed_by_server{0};
  std::mutex serials_mutex;
  std::vector<std::string> serials;  // presented certificate, per successful request, in order

  // Why the first few requests failed, and when, for the test's message.
  std::string failures() {
    std::lock_guard lock(serials_mutex);
    std::string text;
    for (const std::string& f : failures_) text += f + "; ";
    return text;
  }

  // Successful requests under the certificate with `serial`.
  long served_under(const std::string& serial) {
    std::lock_guard lock(serials_mutex);
    return std::count(serials.begin(), serials.end(), serial);
  }

 private:
  void run(unsigned short port, bool fresh_connections) {
    const std::string body = fixture_review("no-env");
    std::unique_ptr<TlsClient> client;
    while (!stop_) {
      if (!client) {
        try {
          client = std::make_unique<TlsClient>(port);
        } catch (const std::exception& e) {
          if (draining_) {
            ++refused;
            return;
          }
          fail(std::string("connecting: ") + e.what());
          std::this_thread::sleep_for(10ms);
          continue;
        }
      }
      try {
        const HttpReply reply = client->request("POST", "/mutate?timeout=10s", body);
        if (reply.status != 200 || !is_patched(reply)) throw std::runtime_error("bad reply");
        ++ok;
        {
          std::lock_guard lock(serials_mutex);
          serials.push_back(client->peer_serial());
        }
        const auto connection = reply.headers.find("connection");
        if (connection != reply.headers.end() && connection->second == "close") {
          ++closed_by_server;
          client.reset();
        } else if (fresh_connections) {
          client.reset();
        }
      } catch (const std::exception& e) {
        fail(std::string("a request after ") + std::to_string(ok) + " served: " + e.what());
        client.reset();
      }
    }
  }

  void fail(std::string why) {
    ++failed;
    std::lock_guard lock(serials_mutex);
    if (failures_.size() < 4) failures_.push_back(std::move(why));
  }

  std::atomic<bool> stop_{false}, draining_{false};
  std::vector<std::string> failures_;  // under serials_mutex
  std::vector<std::thread> threads_;
};

std::string serial_of(const fs::path& cert) {
  FILE* pipe = popen(("openssl x509 -noout -serial -in " + cert.string()).c_str(), "r");
  char line[256] = {};
  const bool read = fgets(line, sizeof line, pipe) != nullptr;
  pclose(pipe);
  std::string text = read ? line : "";
  text = text.substr(text.find('=') + 1);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

}  // namespace

TEST_CASE("certificates: rotation under continuous requests, without a failed request, and a broken pair is refused") {
  const fs::path work =
      fs::temp_directory_path() / (std::string("gpuguard-rotation-").append(std::to_string(::getpid())));
  fs::remove_all(work);
  fs::create_directories(work);
  for (const char* file : {"ca.crt", "ca.key", "tls.crt", "tls.key"}) fs::copy(certs_dir() + "/" + file, work / file);
  KubeletVolume secret("secret");
  secret.publish({{"tls.crt", read_file(work / "tls.crt")}, {"tls.key", read_file(work / "tls.key")}});
  const std::string first_serial = serial_of(work / "tls.crt");

  WebhookProcess webhook({"--tls-cert-file", (secret.dir() / "tls.crt").string(), "--tls-private-key-file",
                          (secret.dir() / "tls.key").string()});
  Load load(webhook.port(), 3, true);
  Load keep_alive(webhook.port(), 1, false);
  // Every client has been served under the first certificate before it changes.
  REQUIRE(eventually([&] { return load.served_under(first_serial) >= 6 && keep_alive.ok >= 2; }));

  // A new serving pair from the same CA, as cert-manager or certs/generate.sh --force issues it.
  const std::string reissue = std::string(GPUGUARD_SOURCE_DIR) + "/certs/generate.sh --force --out " + work.string();
  REQUIRE(std::system((reissue + " >/dev/null").c_str()) == 0);
  const std::string second_serial = serial_of(work / "tls.crt");
  REQUIRE(second_serial != first_serial);
  secret.publish({{"tls.crt", read_file(work / "tls.crt")}, {"tls.key", read_file(work / "tls.key")}});

  const auto took = wait_for(10s, [&] { return TlsClient(webhook.port()).peer_serial() == second_serial; });
  REQUIRE(took.has_value());
  INFO("new certificate served after " << took->count() << " ms");
  // Served under the second one, each request on a connection of its own, without a failure.
  REQUIRE(eventually([&] { return load.served_under(second_serial) >= 6; }));

  // A pair whose key does not match: refused, counted, and the second pair stays.
  secret.publish({{"tls.crt", read_file(work / "tls.crt")}, {"tls.key", read_file(work / "ca.key")}});
  REQUIRE(wait_for(10s, [&] {
    return scrape(webhook.port()).find("gpuguard_tls_certificate_reloads_total{result=\"failure\"} 1") !=
           std::string::npos;
  }));
  // And after the refusal, still served.
  const int ok_at_refusal = load.ok;
  REQUIRE(eventually([&] { return load.ok >= ok_at_refusal + 6; }));
  load.stop();
  keep_alive.stop();

  INFO("failed: " << load.failures() << keep_alive.failures());
  CHECK(load.failed == 0);
  CHECK(keep_alive.failed == 0);
  CHECK(load.ok > 20);
  CHECK(TlsClient(webhook.port()).peer_serial() == second_serial);
  CHECK_THAT(scrape(webhook.port()), Catch::Contains("gpuguard_tls_certificate_reloads_total{result=\"success\"} 1"));
  CHECK(load.served_under(first_serial) > 0);
  CHECK(load.served_under(second_serial) > 0);
  fs::remove_all(work);
}

TEST_CASE("SIGTERM under continuous requests: readyz fails at once, no accepted request fails, exit 0") {
  WebhookProcess webhook({"--shutdown-delay", "1", "--shutdown-timeout", "10"});
  Load load(webhook.port(), 4, false);
  // Keep-alive connections in use when the signal comes.
  REQUIRE(eventually([&] { return load.ok >= 8; }));
  TlsClient probe(webhook.port());
  REQUIRE(probe.request("GET", "/readyz").status == 200);
  const int ok_before = load.ok;

  load.draining();
  const auto signalled = std::chrono::steady_clock::now();
  webhook.signal(SIGTERM);
  const auto unready = wait_for(1s, [&] { return TlsClient(webhook.port()).request("GET", "/readyz").status == 503; });
  REQUIRE(unready.has_value());
  CHECK(*unready < 500ms);

  const int status = webhook.wait_exit(15s);
  const auto exited_after = std::chrono::steady_clock::now() - signalled;
  load.stop();
  CHECK(status == 0);
  CHECK(exited_after >= 1s);  // served through the delay
  CHECK(exited_after < 10s);  // and left well inside the timeout
  INFO("failed: " << load.failures());
  CHECK(load.failed == 0);
  CHECK(load.ok > ok_before);  // requests kept being answered after the signal
  CHECK(load.closed_by_server > 0);
}
