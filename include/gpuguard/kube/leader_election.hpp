#pragma once
// Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it, so that
// gpuguard's replicas and Kubernetes' own controllers read a Lease the same way. Pure: the caller GETs
// the Lease, asks decide() what to write, writes it (create, or update on the resourceVersion read, so
// that two candidates cannot both win), and says how that went; tests drive it with made-up Leases and
// clocks.
//
// A follower never trusts the times in the Lease (another machine's clock): it takes a Lease as expired
// when the Lease has not changed for leaseDuration on its own steady clock since it first saw it. A leader
// leads only while its last successful renewal began less than renew_deadline ago, which is shorter than
// leaseDuration, so it has stopped before any follower can take the Lease over.
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace gpuguard::kube {

// The defaults of kube-controller-manager and controller-runtime.
struct LeaseTiming {
  std::chrono::seconds lease_duration{15};
  std::chrono::seconds renew_deadline{10};
  std::chrono::seconds retry_period{2};
};

// The Lease's spec, and its resourceVersion. Times are MicroTime text ("2026-11-25T12:00:00.000000Z").
struct LeaseRecord {
  std::string holder;
  long long duration_seconds = 0;
  std::string acquire_time, renew_time;
  long long transitions = 0;
  std::string resource_version;
};

// The Lease as the API serves it; nullopt when the text is not one.
std::optional<LeaseRecord> parse_lease(std::string_view lease_json);
// The Lease to create or update: its metadata (with the resourceVersion, when there is one) and spec.
std::string lease_body(std::string_view lease_namespace, std::string_view name, const LeaseRecord& record);
// Now as MicroTime.
std::string micro_time(std::chrono::system_clock::time_point when);

class LeaderElection {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Write { none, create, update };
  struct Decision {
    Write write = Write::none;
    LeaseRecord record;  // what to write
  };

  LeaderElection(std::string identity, LeaseTiming timing);

  // What to do about the Lease as just read (nullopt: there is none), `wall_now` for the times written.
  Decision decide(const std::optional<LeaseRecord>& seen, Clock::time_point now, const std::string& wall_now);
  // The write decide() asked for, begun at `started`, succeeded or not (a conflict is a failure).
  void written(bool succeeded, Clock::time_point started);
  // The Lease to write to give leadership up at once (client-go's ReleaseOnCancel), given the Lease as just
  // read: nullopt unless this candidate leads and still holds it there. Leading ends here either way.
  std::optional<LeaseRecord> release(const std::optional<LeaseRecord>& fresh, const std::string& wall_now);

  bool leading(Clock::time_point now) const;
  const std::string& identity() const { return identity_; }
  // Who holds the Lease, as last read; empty when nobody does.
  const std::string& holder() const { return observed_.holder; }

 private:
  std::string identity_;
  LeaseTiming timing_;
  LeaseRecord observed_;             // the Lease as last read or written
  Clock::time_point observed_at_{};  // when it last changed, on this clock
  bool observed_any_ = false;
  std::optional<Clock::time_point> renewed_;  // when the last successful write of ours began
  LeaseRecord pending_;
};

}  // namespace gpuguard::kube
