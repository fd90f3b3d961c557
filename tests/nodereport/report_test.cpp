// The node report over the fixture host roots in tests/fixtures/node-report: each states the verdict for
// both values the webhook can inject and the findings it must carry under none. Then the files layer on
// its own (links resolved inside the root) and the command over real files.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../deviceplugin/fake_host.hpp"
#include "files.hpp"
#include "gpuguard/files/in_root.hpp"
#include "gpuguard/nodereport/host_root.hpp"
#include "gpuguard/nodereport/node_condition.hpp"
#include "nodereport/go_buildinfo.hpp"
#include "nodereport/rpm_database.hpp"

using namespace gpuguard;
namespace fs = std::filesystem;

namespace {

fs::path cases_dir() { return test::fixtures_dir() / "node-report"; }

std::vector<std::string> codes(const nodereport::Report& report) {
  std::vector<std::string> found;
  for (const auto& finding : report.findings) found.push_back(finding.code);
  return found;
}

}  // namespace

TEST_CASE("node report: every fixture host root gets its verdict for none and for void, with its findings") {
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(cases_dir())) {
    const auto expect = nlohmann::json::parse(test::read_file(entry.path() / "expect.json"));
    const nodereport::HostRoot host(entry.path() / "root");
    for (const std::string value : {"none", "void"}) {
      const nodereport::Report report = nodereport::judge(host, value);
      INFO(entry.path().filename().string()
           << " (" << expect["about"].get<std::string>() << "), value " << value << ": " << report.reason);
      CHECK(nodereport::verdict_name(report.verdict) == expect[value].get<std::string>());
      if (expect.contains("reasonContains")) {
        CHECK_THAT(report.reason, Catch::Contains(expect["reasonContains"].get<std::string>()));
      }
      CHECK(report.value_honoured() == (expect[value] == "honoured" || expect[value] == "not-acted-on"));
      if (report.verdict == nodereport::Verdict::not_acted_on) CHECK_FALSE(report.doors.empty());
      const auto json = nlohmann::json::parse(nodereport::to_json(report));  // whatever bytes the files held
      CHECK(json["verdict"] == expect[value]);
      const nodereport::Condition condition = nodereport::condition_of(report);
      CHECK(condition.status == (report.value_honoured() ? "True" : "False"));
      CHECK_THAT(condition.message, Catch::StartsWith("NVIDIA_VISIBLE_DEVICES=" + value + ": "));
      // Whether the environment is a second line where the enforcer does not answer: said in the report and
      // the condition; a case says it where it is so.
      CHECK(report.hardened == expect.value("hardened", false));
      CHECK(json["hardened"] == report.hardened);
      CHECK_THAT(condition.message, Catch::Contains(report.hardened ? "; hardened: " : "; not hardened: "));
      for (const auto& finding : report.findings) {
        if (finding.code == "malformed-file") CHECK(finding.line > 0);
      }
      if (value == "none") {
        for (const auto& code : expect["findingsUnderNone"])
          CHECK_THAT(codes(report), Catch::VectorContains(code.get<std::string>()));
      }
    }
    ++cases;
  }
  CHECK(cases >= 20);
}

TEST_CASE("node report: the Node condition's patch is read back as written, merged by type among others") {
  nodereport::Report report;
  report.value = "none";
  report.verdict = nodereport::Verdict::breaks_pods;
  report.reason = "cdi mode and no CDI device nvidia.com/gpu=none";
  const nodereport::Condition condition = nodereport::condition_of(report);
  CHECK(condition.status == "False");
  CHECK(condition.reason == "BreaksPods");
  const auto patch = nlohmann::json::parse(
      nodereport::condition_patch(condition, nodereport::rfc3339(1764072000), nodereport::rfc3339(0)));
  REQUIRE(patch["status"]["conditions"].size() == 1);
  CHECK(patch["status"]["conditions"][0]["type"] == "GPUIsolation");
  CHECK(patch["status"]["conditions"][0]["lastHeartbeatTime"] == "2025-11-25T12:00:00Z");
  CHECK(patch["status"]["conditions"][0]["lastTransitionTime"] == "1970-01-01T00:00:00Z");

  nlohmann::json node = {{"kind", "Node"}, {"status", {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
  CHECK_FALSE(nodereport::seen_condition(node.dump()));
  node["status"]["conditions"].push_back(patch["status"]["conditions"][0]);
  const auto seen = nodereport::seen_condition(node.dump());
  REQUIRE(seen);
  CHECK(seen->status == "False");
  CHECK(seen->reason == "BreaksPods");
  CHECK(seen->message == condition.message);
  CHECK(seen->last_transition_time == "1970-01-01T00:00:00Z");
  for (const char* malformed : {"", "[]", "{\"status\": 1}", "{\"status\": {\"conditions\": {}}}", "{"})
    CHECK_FALSE(nodereport::seen_condition(malformed));
}

namespace {

// One file in memory, at a host path: for the rpm database as it is and as corrupted.
class OneFile : public nodereport::HostFiles {
 public:
  OneFile(std::string path, std::string content) : path_(std::move(path)), bytes(std::move(content)) {}
  std::optional<std::string> read(const std::string& path) const override {
    return path == path_ ? std::optional(bytes) : std::nullopt;
  }
  std::optional<std::string> read_range(const std::string& path, std::uint64_t offset,
                                        std::size_t length) const override {
    if (path != path_) return std::nullopt;
    return offset >= bytes.size() ? std::string() : bytes.substr(offset, length);
  }
  std::vector<std::string> list(const std::string&) const override { return {}; }
  std::vector<std::string> subdirectories(const std::string&) const override { return {}; }
  bool exists(const std::string& path) const override { return path == path_; }

 private:
  std::string path_;

 public:
  std::string bytes;
};

const std::string kRpmdb = "/var/lib/rpm/rpmdb.sqlite";

std::string rpm_fixture() { return test::read_file(cases_dir() / "rpm-jit-cdi-1.18.1/root/var/lib/rpm/rpmdb.sqlite"); }

}  // namespace

TEST_CASE("node report: rpm's SQLite database, as rpm wrote it, gives every package's version") {
  // make-rpmdb.sh's twelve packages, found through the Name table and a two-level Packages b-tree whose
  // headers spill onto overflow pages.
  const std::map<std::string, std::string> installed = {{"nvidia-container-toolkit-base", "1.18.1"},
                                                        {"nvidia-container-toolkit", "1.18.1"},
                                                        {"libnvidia-container1", "1.18.1"},
                                                        {"kernel-core", "5.14.0"},
                                                        {"bash", "5.1.8"},
                                                        {"glibc", "2.34"},
                                                        {"containerd.io", "1.7.27"},
                                                        {"openssl-libs", "3.2.2"},
                                                        {"systemd", "252"},
                                                        {"coreutils", "8.32"},
                                                        {"python3", "3.9.21"},
                                                        {"tzdata", "2025b"}};
  const OneFile host(kRpmdb, rpm_fixture());
  std::vector<std::string> names = {"not-installed"};
  for (const auto& [name, version] : installed) names.push_back(name);
  const nodereport::RpmLookup lookup = nodereport::find_rpm_packages(host, kRpmdb, names);
  REQUIRE(lookup.error.empty());
  std::map<std::string, std::string> found;
  for (const auto& package : lookup.packages) {
    found[package.name] = package.version;
    CHECK(package.release == "1");
  }
  CHECK(found == installed);
}

TEST_CASE("node report: a corrupt rpm database is a finding, never a crash or a wrong version") {
  const std::string good = rpm_fixture();
  const std::vector<std::string> names = {"nvidia-container-toolkit-base", "nvidia-container-toolkit"};
  for (const std::size_t size :
       {std::size_t{0}, std::size_t{50}, std::size_t{100}, std::size_t{4096}, std::size_t{20000}, good.size() / 2}) {
    const OneFile truncated(kRpmdb, good.substr(0, size));
    INFO("truncated to " << size);
    CHECK_FALSE(nodereport::find_rpm_packages(truncated, kRpmdb, names).error.empty());
  }
  const OneFile text(kRpmdb, "Package: nvidia-container-toolkit\nVersion: 1.18.1\n");
  CHECK(nodereport::find_rpm_packages(text, kRpmdb, names).error == "shorter than a SQLite database's header");
  // Every 97th byte changed in turn: each lookup ends, with the right version, none, or an error.
  OneFile flipped(kRpmdb, good);
  int errors = 0;
  for (std::size_t at = 0; at < good.size(); at += 97) {
    flipped.bytes[at] = static_cast<char>(flipped.bytes[at] ^ 0x5a);
    const nodereport::RpmLookup lookup = nodereport::find_rpm_packages(flipped, kRpmdb, names);
    errors += lookup.error.empty() ? 0 : 1;
    for (const auto& package : lookup.packages) CHECK(package.name.starts_with("nvidia-container-toolkit"));
    flipped.bytes[at] = good[at];
  }
  CHECK(errors > 0);
  // Through the report: the file named, the version unknown.
  const nodereport::Report report = nodereport::judge(OneFile(kRpmdb, good.substr(0, 8192)), "none");
  CHECK_FALSE(report.facts.toolkit_version);
  CHECK_THAT(codes(report), Catch::VectorContains(std::string("unreadable-package-database")));
}

TEST_CASE("node report: the facts say what was read, and drop-ins override the main file") {
  const nodereport::Report report =
      nodereport::judge(nodereport::HostRoot(cases_dir() / "containerd-v3-drop-in" / "root"), "none");
  CHECK(report.facts.container_runtime == "containerd");
  CHECK(report.facts.runtime_config_files ==
        std::vector<std::string>{"/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml"});
  CHECK(report.facts.default_runtime == "nvidia");
  CHECK(report.facts.default_runtime_binary == "/usr/bin/nvidia-container-runtime");
  CHECK(report.facts.toolkit_version == "1.17.8");
  CHECK(report.facts.resolved_mode == "legacy");
  const auto json = nlohmann::json::parse(nodereport::to_json(report));
  CHECK(json["valueHonoured"] == true);
  CHECK(json["verdict"] == "honoured");
  CHECK(json["facts"]["runtime"]["defaultIsNvidia"] == true);
  CHECK(json["facts"]["toolkit"]["config"] == "/etc/nvidia-container-runtime/config.toml");
}

TEST_CASE("node report: the GPU Operator's toolkit is read where it installed it, beside the runtime binary") {
  const nodereport::Report report =
      nodereport::judge(nodereport::HostRoot(cases_dir() / "gpu-operator-jit-cdi-1.18.1" / "root"), "none");
  const std::string dir = "/usr/local/nvidia/toolkit";
  CHECK(report.facts.nvidia_runtime_binary == dir + "/nvidia-container-runtime");
  // The config the operator's wrapper names, not the one a package left in /etc (mode legacy there).
  CHECK(report.facts.toolkit_config_file == dir + "/.config/nvidia-container-runtime/config.toml");
  CHECK(report.facts.resolved_mode == "jit-cdi");
  CHECK(report.facts.toolkit_version == "1.18.1");
  CHECK(report.facts.toolkit_version_source == dir + "/libnvidia-container.so.1.18.1");
  CHECK_THAT(nodereport::to_text(report),
             Catch::Contains("version 1.18.1 (" + dir + "/libnvidia-container.so.1.18.1)"));
  // A package's runtime in /usr/bin keeps reading /etc's config.
  const nodereport::Report packaged =
      nodereport::judge(nodereport::HostRoot(cases_dir() / "jit-cdi-1.18.1" / "root"), "none");
  CHECK(packaged.facts.toolkit_config_file == "/etc/nvidia-container-runtime/config.toml");
  CHECK(packaged.facts.toolkit_version_source == "/var/lib/dpkg/status");
}

TEST_CASE("node report: the toolkit's version is the one of the binary that runs, read from its Go build information") {
  // NVIDIA's own nvidia-container-runtime, built from the module e2e/go.mod pins: the module's version.
  const fs::path built(GPUGUARD_NVIDIA_RUNTIME_BIN);
  const nodereport::HostRoot whole(built.parent_path());
  CHECK(nodereport::toolkit_version_of_binary(whole, "/" + built.filename().string()) == "1.20.1");
  // As NVIDIA's release build stamps it (-X .../internal/info.version), started by the GPU Operator's wrapper
  // script, beside a package that says another version.
  const nodereport::Report report =
      nodereport::judge(nodereport::HostRoot(cases_dir() / "gpu-operator-binary-version" / "root"), "none");
  const std::string dir = "/usr/local/nvidia/toolkit";
  CHECK(report.facts.toolkit_version == "1.18.1");
  CHECK(report.facts.toolkit_version_source == dir + "/nvidia-container-runtime.real");
  CHECK(report.facts.toolkit_config_file == dir + "/.config/nvidia-container-runtime/config.toml");
  CHECK(report.facts.runtime_mode == "auto");
  CHECK(report.facts.resolved_mode == "jit-cdi");
  CHECK_THAT(report.facts.read_files, Catch::VectorContains(dir + "/nvidia-container-runtime.real"));
  // Files that are not such binaries, or name no version of the toolkit, say nothing.
  const nodereport::HostRoot fixtures(cases_dir());
  CHECK_FALSE(nodereport::toolkit_version_of_binary(fixtures, "/csv-mode/expect.json").has_value());
  CHECK_FALSE(nodereport::toolkit_version_of_binary(fixtures, "/absent").has_value());
  CHECK_FALSE(nodereport::toolkit_version_of_binary(whole, "/nri-runtime").has_value());
  // The build information past the first megabyte, across a chunk's edge: found.
  const fs::path root = fs::temp_directory_path() / ("gpuguard-go-binary-" + std::to_string(::getpid()));
  fs::create_directories(root);
  const std::string real = test::read_file(cases_dir() / "gpu-operator-binary-version/root" /
                                           (dir.substr(1) + "/nvidia-container-runtime.real"));
  const std::size_t magic = real.find("\xff Go buildinf:");
  REQUIRE(magic != std::string::npos);
  std::ofstream(root / "late", std::ios::binary) << std::string((std::size_t{1} << 20) - 5, '\0') << real.substr(magic);
  CHECK(nodereport::toolkit_version_of_binary(nodereport::HostRoot(root), "/late") == "1.18.1");
  fs::remove_all(root);
}

TEST_CASE("node report: a security fix is reported missing only where the node runs an affected version and mode") {
  const auto fixes = [](const std::string& fixture) {
    std::vector<std::string> cves;
    const auto report = nodereport::judge(nodereport::HostRoot(cases_dir() / fixture / "root"), "none");
    for (const auto& finding : report.findings) {
      if (finding.code != "missing-security-fix") continue;
      CHECK(finding.severity == nodereport::Severity::critical);
      CHECK(finding.file == "/var/lib/dpkg/status");
      cves.push_back(finding.message.substr(0, finding.message.find(' ')));
    }
    return cves;
  };
  CHECK(fixes("legacy-1.16.1") == std::vector<std::string>{"CVE-2024-0132", "CVE-2025-23266"});
  // CVE-2024-0132 does not affect CDI; CVE-2025-23266 does.
  CHECK(fixes("cdi-1.17.7-with-none-device") == std::vector<std::string>{"CVE-2025-23266"});
  CHECK(fixes("legacy-containerd-v2").empty());  // 1.17.8
  CHECK(fixes("jit-cdi-1.18.2").empty());
}

TEST_CASE("node report: host links resolve inside the host root, never into this container's files") {
  const fs::path root = fs::temp_directory_path() / ("gpuguard-host-root-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "etc/nvidia-container-runtime");
  fs::create_directories(root / "opt/nvidia");
  std::ofstream(root / "opt/nvidia/config.toml") << "[nvidia-container-runtime]\nmode = \"cdi\"\n";
  // An absolute link, as on the host: /etc/nvidia-container-runtime/config.toml -> /opt/nvidia/config.toml.
  fs::create_symlink("/opt/nvidia/config.toml", root / "etc/nvidia-container-runtime/config.toml");
  // And one that climbs out: it must stay at the root's top.
  fs::create_symlink("../../../../../../etc/hostname", root / "etc/escape");
  const nodereport::HostRoot host(root);
  CHECK(host.read("/etc/nvidia-container-runtime/config.toml") == "[nvidia-container-runtime]\nmode = \"cdi\"\n");
  CHECK_FALSE(host.read("/etc/escape").has_value());
  CHECK(host.list("/etc/nvidia-container-runtime") == std::vector<std::string>{"config.toml"});
  CHECK(nodereport::judge(host, "void").facts.mode == "cdi");
  fs::remove_all(root);
}

TEST_CASE("node report: a path followed part by part ends where the kernel's own resolution does") {
  // The independent implementation is the kernel: with this process's root, realpath(3) resolves the
  // same path, and follow_in_root must agree with it on every path that exists.
  const fs::path top = fs::temp_directory_path() / ("gpuguard-follow-" + std::to_string(::getpid()));
  fs::remove_all(top);
  struct Removed {
    const fs::path& path;
    ~Removed() { fs::remove_all(path); }
  } removed{top};  // a failed REQUIRE leaves nothing behind either
  fs::create_directories(top / "a/b/c");
  fs::create_directories(top / "d");
  std::ofstream(top / "a/b/c/file") << "x";
  fs::create_symlink("b/c", top / "a/to-c");                       // relative, down
  fs::create_symlink("../a/b", top / "d/up-and-over");             // relative, up
  fs::create_symlink(top / "a", top / "d/absolute");               // absolute
  fs::create_symlink("../../d/absolute/to-c", top / "a/b/chain");  // a link through links
  fs::create_symlink("c/../../b/./c/file", top / "a/b/dotted");    // dots inside a target
  for (const char* path : {"a/to-c/file", "d/up-and-over/c/file", "d/absolute/b/c", "a/b/chain/file", "a/b/dotted",
                           "d/absolute/to-c/../c/./file", "a/b/c/../../to-c"}) {
    const std::string asked = (top / path).string();
    char kernel[PATH_MAX];
    REQUIRE(::realpath(asked.c_str(), kernel) != nullptr);
    const files::Followed followed = files::follow_in_root("/", asked);
    INFO(path);
    CHECK(followed.path == kernel);
    CHECK_FALSE(followed.loops);
    CHECK_FALSE(followed.links.empty());
  }
  // A part that does not exist is kept as written, and what follows it too.
  CHECK(files::follow_in_root("/", (top / "a/to-c/missing/x").string()).path == (top / "a/b/c/missing/x").string());
  // The links followed are named where they lie, in order.
  CHECK(
      files::follow_in_root("/", (top / "a/b/chain").string()).links ==
      std::vector<std::string>{(top / "a/b/chain").string(), (top / "d/absolute").string(), (top / "a/to-c").string()});
  // Links that loop do not resolve.
  fs::create_symlink("loop-b", top / "loop-a");
  fs::create_symlink("loop-a", top / "loop-b");
  CHECK(files::follow_in_root("/", (top / "loop-a/x").string()).loops);

  // A deep path costs one lookup a part, not one walk from the root a part: 1,000 parts, a link at the
  // bottom back to the top, and a few parts more.
  std::string relative = "deep";
  fs::create_directory(top / relative);
  int dir = ::open((top / relative).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  for (int i = 0; i < 1000; ++i) {
    relative += "/a";
    REQUIRE(::mkdirat(dir, "a", 0755) == 0);  // part by part: libstdc++'s create_directories says too long
    const int child = ::openat(dir, "a", O_PATH | O_DIRECTORY | O_CLOEXEC);
    ::close(dir);
    dir = child;
  }
  REQUIRE(::symlinkat((top / "a").c_str(), dir, "up") == 0);
  ::close(dir);
  std::size_t steps = files::kFollowStepsMax;
  const std::string asked = (top / relative / "up/b/c/file").string();
  const files::Followed followed = files::follow_in_root("/", asked, &steps);
  CHECK(followed.path == (top / "a/b/c/file").string());
  const std::size_t parts = static_cast<std::size_t>(std::count(asked.begin(), asked.end(), '/'));
  const std::string top_text = top.string();
  const std::size_t target_parts = static_cast<std::size_t>(std::count(top_text.begin(), top_text.end(), '/')) + 1;
  CHECK(files::kFollowStepsMax - steps == parts + target_parts);
  // A budget smaller than the path: not followed to its end, the budget spent, nothing taken for where it leads.
  std::size_t small = 500;
  const files::Followed cut = files::follow_in_root("/", asked, &small);
  CHECK(cut.over_budget);
  CHECK(cut.path.empty());
  CHECK(small == 0);
}

TEST_CASE("node report: the command prints JSON and exits 3 when the value is not honoured, 0 when it is") {
  const auto run = [](const std::string& args) {
    const std::string command = std::string(GPUGUARD_DEVICE_PLUGIN_BIN) + " node-report " + args + " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    std::string output;
    char chunk[4096];
    while (const std::size_t n = std::fread(chunk, 1, sizeof chunk, pipe)) output.append(chunk, n);
    const int status = ::pclose(pipe);
    return std::pair{WEXITSTATUS(status), output};
  };
  const std::string root = (cases_dir() / "jit-cdi-1.18.1" / "root").string();
  const auto [leaks, json] = run("--host-root " + root + " --value none --format json");
  CHECK(leaks == 3);
  const auto report = nlohmann::json::parse(json);
  CHECK(report["valueHonoured"] == false);
  CHECK(report["verdict"] == "leaks");
  CHECK(report["facts"]["toolkit"]["version"] == "1.18.1");
  const auto [honoured, text] = run("--host-root " + root + " --value void");
  CHECK(honoured == 0);
  CHECK_THAT(text, Catch::StartsWith("NVIDIA_VISIBLE_DEVICES=void: honoured"));
  CHECK(run("--value all").first == 2);
  // A host root with nothing in it is facts, not an error.
  const auto [empty_status, empty] = run("--host-root " + (cases_dir() / "no-such-root").string() + " --format json");
  CHECK(empty_status == 0);
  CHECK(nlohmann::json::parse(empty)["verdict"] == "not-acted-on");
}

TEST_CASE("node report: CRI-O's drop-ins are walked as CRI-O walks them, links to directories not followed, bounded") {
  test::FakeHost host("crio-walk");
  host.write("etc/crio/crio.conf", "[crio.runtime]\ndefault_runtime = \"crun\"\n");
  host.write("etc/crio/crio.conf.d/10-gpu/nested/nvidia.toml",
             "[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\n"
             "runtime_path = \"/usr/bin/nvidia-container-runtime\"\n");
  // A link to its own directory: followed, it would be walked again and again.
  fs::create_directory_symlink(".", host.root() / "etc/crio/crio.conf.d/10-gpu/loop");
  const nodereport::Report read = nodereport::judge(nodereport::HostRoot(host.root()), "void");
  INFO(read.reason);
  CHECK(read.facts.container_runtime == "cri-o");
  CHECK(read.facts.default_is_nvidia);
  CHECK(read.verdict != nodereport::Verdict::cannot_judge);
  CHECK(std::count(read.facts.runtime_config_files.begin(), read.facts.runtime_config_files.end(),
                   "/etc/crio/crio.conf.d/10-gpu/nested/nvidia.toml") == 1);

  // Eight levels deep: past what the report reads, so it cannot judge, and says where.
  host.write("etc/crio/crio.conf.d/20/a/b/c/d/e/f/g/deep.conf", "[crio.runtime]\n");
  const nodereport::Report deep = nodereport::judge(nodereport::HostRoot(host.root()), "void");
  CHECK(deep.verdict == nodereport::Verdict::cannot_judge);
  CHECK_THAT(deep.reason, Catch::Contains("/etc/crio/crio.conf.d/20/a/b/c/d/e/f/g: past the 256 entries and 8 levels"));
  fs::remove_all(host.root() / "etc/crio/crio.conf.d/20");

  // More entries than it reads: the same.
  for (int i = 0; i < 260; ++i) host.write("etc/crio/crio.conf.d/30-many/" + std::to_string(1000 + i) + ".conf", "");
  const nodereport::Report many = nodereport::judge(nodereport::HostRoot(host.root()), "void");
  CHECK(many.verdict == nodereport::Verdict::cannot_judge);
  CHECK_THAT(many.reason, Catch::Contains("past the 256 entries"));
}
