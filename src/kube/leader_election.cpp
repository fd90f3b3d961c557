// client-go's tryAcquireOrRenew, one step at a time, and the Lease's JSON both ways.
#include "gpuguard/kube/leader_election.hpp"

#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

namespace gpuguard::kube {
namespace {

using nlohmann::json;

bool same_spec(const LeaseRecord& a, const LeaseRecord& b) {
  return a.holder == b.holder && a.duration_seconds == b.duration_seconds && a.acquire_time == b.acquire_time &&
         a.renew_time == b.renew_time && a.transitions == b.transitions;
}

std::string text_at(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

long long number_at(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<long long>() : 0;
}

}  // namespace

std::optional<LeaseRecord> parse_lease(std::string_view lease_json) {
  const json lease = json::parse(lease_json, nullptr, false);
  if (!lease.is_object() || text_at(lease, "kind") != "Lease") return std::nullopt;
  LeaseRecord record;
  if (const auto metadata = lease.find("metadata"); metadata != lease.end() && metadata->is_object()) {
    record.resource_version = text_at(*metadata, "resourceVersion");
  }
  if (const auto spec = lease.find("spec"); spec != lease.end() && spec->is_object()) {
    record.holder = text_at(*spec, "holderIdentity");
    record.duration_seconds = number_at(*spec, "leaseDurationSeconds");
    record.acquire_time = text_at(*spec, "acquireTime");
    record.renew_time = text_at(*spec, "renewTime");
    record.transitions = number_at(*spec, "leaseTransitions");
  }
  return record;
}

std::string lease_body(std::string_view lease_namespace, std::string_view name, const LeaseRecord& record) {
  json metadata = {{"name", name}, {"namespace", lease_namespace}};
  if (!record.resource_version.empty()) metadata["resourceVersion"] = record.resource_version;
  json spec = {{"holderIdentity", record.holder},
               {"leaseDurationSeconds", record.duration_seconds},
               {"leaseTransitions", record.transitions}};
  if (!record.acquire_time.empty()) spec["acquireTime"] = record.acquire_time;
  if (!record.renew_time.empty()) spec["renewTime"] = record.renew_time;
  return json{{"apiVersion", "coordination.k8s.io/v1"}, {"kind", "Lease"}, {"metadata", metadata}, {"spec", spec}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

std::string micro_time(std::chrono::system_clock::time_point when) {
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(when.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1'000'000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<long long>(micros % 1'000'000));
  return text;
}

LeaderElection::LeaderElection(std::string identity, LeaseTiming timing)
    : identity_(std::move(identity)), timing_(timing) {}

LeaderElection::Decision LeaderElection::decide(const std::optional<LeaseRecord>& seen, Clock::time_point now,
                                                const std::string& wall_now) {
  const long long duration = timing_.lease_duration.count();
  if (!seen) {
    pending_ = {identity_, duration, wall_now, wall_now, 0, {}};
    return {Write::create, pending_};
  }
  if (!observed_any_ || !same_spec(*seen, observed_)) {
    observed_at_ = now;
    observed_any_ = true;
  }
  observed_ = *seen;
  const bool mine = seen->holder == identity_;
  if (!mine) renewed_.reset();  // someone else holds it: whatever we thought, we lead no more
  const auto held_for = std::chrono::seconds(seen->duration_seconds > 0 ? seen->duration_seconds : duration);
  if (!seen->holder.empty() && !mine && now < observed_at_ + held_for) return {};
  pending_ = {identity_,
              duration,
              mine ? seen->acquire_time : wall_now,
              wall_now,
              mine ? seen->transitions : seen->transitions + 1,
              seen->resource_version};
  return {Write::update, pending_};
}

void LeaderElection::written(bool succeeded, Clock::time_point started) {
  if (!succeeded) return;
  renewed_ = started;
  observed_ = pending_;
  observed_at_ = started;
  observed_any_ = true;
}

std::optional<LeaseRecord> LeaderElection::release(const std::optional<LeaseRecord>& fresh,
                                                   const std::string& wall_now) {
  const bool held = renewed_ && observed_.holder == identity_ && fresh && fresh->holder == identity_;
  renewed_.reset();
  if (!held) return std::nullopt;
  // The API refuses a duration of 0; 1 s with nobody holding it lets any candidate take it at once.
  return LeaseRecord{{}, 1, wall_now, wall_now, fresh->transitions, fresh->resource_version};
}

bool LeaderElection::leading(Clock::time_point now) const {
  return renewed_ && observed_.holder == identity_ && now < *renewed_ + timing_.renew_deadline;
}

}  // namespace gpuguard::kube
