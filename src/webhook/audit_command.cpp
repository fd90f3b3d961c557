#include "audit_command.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "gpuguard/audit/pod_audit.hpp"
#include "gpuguard/claims/claim_cache.hpp"
#include "gpuguard/log/log.hpp"
#include "gpuguard/nodereport/node_condition.hpp"
#include "offline.hpp"

namespace gpuguard::webhook {
namespace {

namespace po = boost::program_options;
using nlohmann::json;

constexpr const char* kUsage =
    "usage: gpuguard-webhook audit [--policy-dir DIR] [--claims FILE] [--nodes FILE] [--output table|json] FILE|-\n"
    "  FILE: a PodList, as `kubectl get pods -A -o json` prints it (- for standard input)\n"
    "  --claims FILE: `kubectl get resourceclaims,resourceclaimtemplates -A -o json`, to resolve DRA claims\n"
    "  --nodes FILE: `kubectl get nodes -o json`, to list the nodes whose GPUIsolation condition is not True\n"
    "  --policy-dir DIR: a policy as the mounted ConfigMap holds it, one file per key (default: the defaults)\n"
    "  --output table|json: how the exposures are printed (default table); exit 1 when there is any\n";

struct Row {
  std::string namespace_, pod;
  admission::Exposure exposure;
};

// The nodes of `--nodes`: how many, how many carry the device plugin's GPUIsolation condition, and those
// where it is not True (the value the webhook injects does not keep GPUs out there).
struct NodeRow {
  std::string name;
  nodereport::SeenCondition condition;
};
struct Nodes {
  std::size_t total = 0, reporting = 0;
  std::vector<NodeRow> not_holding;
  std::map<std::string, nodereport::SeenCondition, std::less<>> conditions;  // every reporting node's
};

// "app", or "setup (initContainers)" for a container outside spec.containers.
std::string container_cell(const admission::Exposure& e) {
  return e.list == "containers" ? e.container : e.container + " (" + e.list + ")";
}

std::string text_at(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

// How many pods have at least one exposure: rows come pod by pod.
std::size_t exposed_pods(const std::vector<Row>& rows) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i == 0 || rows[i].namespace_ != rows[i - 1].namespace_ || rows[i].pod != rows[i - 1].pod) ++count;
  }
  return count;
}

// Columns padded to their widest cell, two spaces apart; the last one is not padded.
void print_columns(const std::vector<std::vector<std::string>>& lines) {
  std::vector<std::size_t> width(lines.front().size());
  for (const auto& cells : lines) {
    for (std::size_t i = 0; i < cells.size(); ++i) width[i] = std::max(width[i], cells[i].size());
  }
  for (const auto& cells : lines) {
    std::string out;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      out += cells[i];
      if (i + 1 < cells.size()) out += std::string(width[i] - cells[i].size() + 2, ' ');
    }
    std::cout << out << "\n";
  }
}

void print_nodes_table(const Nodes& nodes) {
  std::cout << "\n";
  if (!nodes.not_holding.empty()) {
    std::vector<std::vector<std::string>> lines = {{"NODE", "GPUISOLATION", "REASON", "SINCE", "MESSAGE"}};
    for (const NodeRow& n : nodes.not_holding) {
      lines.push_back(
          {n.name, n.condition.status, n.condition.reason, n.condition.last_transition_time, n.condition.message});
    }
    print_columns(lines);
    std::cout << "\n";
  }
  std::cout << "GPU isolation does not hold on " << nodes.not_holding.size() << " of " << nodes.total << " nodes ("
            << nodes.reporting << " report the GPUIsolation condition)\n";
}

void print_table(const std::vector<Row>& rows, std::size_t pods) {
  if (!rows.empty()) {
    std::vector<std::vector<std::string>> lines = {
        {"NAMESPACE", "POD", "CONTAINER", "DOOR", "DETAIL", "WEBHOOK WOULD"}};
    for (const Row& r : rows) {
      lines.push_back(
          {r.namespace_, r.pod, container_cell(r.exposure), r.exposure.door, r.exposure.detail, r.exposure.webhook});
    }
    print_columns(lines);
    std::cout << "\n";
  }
  std::cout << rows.size() << " exposures in " << exposed_pods(rows) << " of " << pods << " pods\n";
}

void print_json(const std::vector<Row>& rows, std::size_t pods, const std::optional<Nodes>& nodes) {
  json exposures = json::array();
  for (const Row& r : rows) {
    exposures.push_back({{"namespace", r.namespace_},
                         {"pod", r.pod},
                         {"container", r.exposure.container},
                         {"list", r.exposure.list},
                         {"door", r.exposure.door},
                         {"detail", r.exposure.detail},
                         {"webhook", r.exposure.webhook}});
  }
  json report = {{"pods", pods}, {"exposedPods", exposed_pods(rows)}, {"exposures", exposures}};
  if (nodes) {
    json not_holding = json::array();
    for (const NodeRow& n : nodes->not_holding) {
      not_holding.push_back({{"name", n.name},
                             {"status", n.condition.status},
                             {"reason", n.condition.reason},
                             {"message", n.condition.message},
                             {"lastTransitionTime", n.condition.last_transition_time},
                             {"lastHeartbeatTime", n.condition.last_heartbeat_time}});
    }
    report["nodes"] = {{"nodes", nodes->total}, {"reporting", nodes->reporting}, {"notHolding", not_holding}};
  }
  std::cout << report.dump(2) << "\n";
}

// A NodeList (or one Node) into `nodes`; false after saying why on standard error.
bool read_nodes(const std::string& source, Nodes& nodes) {
  std::string text;
  if (!read_source(source, text)) {
    std::cerr << "gpuguard-webhook audit: cannot read " << source << "\n";
    return false;
  }
  const json document = json::parse(text, nullptr, false);
  std::vector<json> items;
  if (document.is_object() && document.contains("items") && document["items"].is_array()) {
    items = document["items"].get<std::vector<json>>();
  } else if (document.is_object() && text_at(document, "kind") == "Node") {
    items.push_back(document);
  } else {
    std::cerr << "gpuguard-webhook audit: " << source << " is not a NodeList (kubectl get nodes -o json) or a Node\n";
    return false;
  }
  for (const json& node : items) {
    if (!node.is_object() || text_at(node, "kind") != "Node") {
      std::cerr << "gpuguard-webhook audit: " << source << " holds something other than Nodes\n";
      return false;
    }
    ++nodes.total;
    const auto condition = nodereport::seen_condition(node.dump());
    if (!condition) continue;
    ++nodes.reporting;
    const json& metadata = node.contains("metadata") ? node["metadata"] : json::object();
    const std::string name = metadata.is_object() ? text_at(metadata, "name") : "";
    nodes.conditions.emplace(name, *condition);
    if (condition->status == "True") continue;
    nodes.not_holding.push_back({name, *condition});
  }
  return true;
}

// The pods of a PodList (kubectl get pods -A -o json) or of one Pod, from a file or "-"; false after saying why not.
bool read_pods(const std::string& source, std::vector<json>& pods) {
  std::string text;
  if (!read_source(source, text)) {
    std::cerr << "gpuguard-webhook audit: cannot read " << (source == "-" ? "standard input" : source) << "\n";
    return false;
  }
  const json document = json::parse(text, nullptr, false);
  if (document.is_object() && document.contains("items") && document["items"].is_array()) {
    for (const json& item : document["items"]) pods.push_back(item);
  } else if (document.is_object() && text_at(document, "kind") == "Pod") {
    pods.push_back(document);
  } else {
    std::cerr << "gpuguard-webhook audit: " << source << " is not a PodList (kubectl get pods -A -o json) or a Pod\n";
    return false;
  }
  return true;
}

// A row for each exposure of each pod, and of its node where the nodes are given; false after saying which pod
// cannot be read.
bool audit_rows(const std::vector<json>& pods, const policy::Policy& policy, const claims::ClaimCache* lookup,
                const std::optional<Nodes>& nodes, std::vector<Row>& rows) {
  for (const json& pod : pods) {
    std::string error;
    const auto audit = audit::audit_pod(pod.dump(), policy, lookup, error);
    if (!audit) {
      const json& metadata = pod.is_object() && pod.contains("metadata") ? pod["metadata"] : json::object();
      std::cerr << "gpuguard-webhook audit: pod "
                << (metadata.is_object() ? text_at(metadata, "namespace") + "/" + text_at(metadata, "name") : "")
                << " cannot be read: " << error << "\n";
      return false;
    }
    for (const admission::Exposure& e : audit->exposures()) rows.push_back({audit->namespace_, audit->name, e});
    if (!nodes) continue;
    const auto condition = nodes->conditions.find(audit->node);
    for (admission::Exposure& e :
         audit::node_exposures(*audit, condition != nodes->conditions.end() ? &condition->second : nullptr)) {
      rows.push_back({audit->namespace_, audit->name, std::move(e)});
    }
  }
  return true;
}

}  // namespace

int run_audit_command(const std::vector<std::string>& args) {
  po::options_description options;
  options.add_options()("help", "")("policy-dir", po::value<std::string>())("claims", po::value<std::string>())(
      "output", po::value<std::string>()->default_value("table"))("nodes", po::value<std::string>())(
      "pods", po::value<std::string>());
  po::positional_options_description positional;
  positional.add("pods", 1);
  po::variables_map flags;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), flags);
    po::notify(flags);
  } catch (const po::error& e) {
    std::cerr << "gpuguard-webhook audit: " << e.what() << "\n" << kUsage;
    return 2;
  }
  if (flags.count("help")) {
    std::cout << kUsage;
    return 0;
  }
  const std::string output = flags["output"].as<std::string>();
  if (!flags.count("pods") || (output != "table" && output != "json")) {
    std::cerr << kUsage;
    return 2;
  }
  log::set_level(log::Level::warn);  // standard error is for problems here; standard output is the report
  std::optional<std::filesystem::path> policy_dir;
  if (flags.count("policy-dir")) policy_dir = flags["policy-dir"].as<std::string>();
  const auto policy = load_policy("audit", policy_dir);
  if (!policy) return 2;

  claims::ClaimCache claims;
  if (flags.count("claims") && !load_claims("audit", flags["claims"].as<std::string>(), claims)) return 2;
  const claims::ClaimCache* lookup = flags.count("claims") ? &claims : nullptr;
  std::optional<Nodes> nodes;
  if (flags.count("nodes") && !read_nodes(flags["nodes"].as<std::string>(), nodes.emplace())) return 2;

  std::vector<json> pods;
  if (!read_pods(flags["pods"].as<std::string>(), pods)) return 2;
  std::vector<Row> rows;
  if (!audit_rows(pods, *policy, lookup, nodes, rows)) return 2;
  if (output == "json") {
    print_json(rows, pods.size(), nodes);
  } else {
    print_table(rows, pods.size());
    if (nodes) print_nodes_table(*nodes);
  }
  return rows.empty() && (!nodes || nodes->not_holding.empty()) ? 0 : 1;
}

}  // namespace gpuguard::webhook
