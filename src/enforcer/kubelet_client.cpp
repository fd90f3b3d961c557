// The kubelet's pod-resources API over gRPC (include/gpuguard/enforcer/kubelet_client.hpp).
#include "gpuguard/enforcer/kubelet_client.hpp"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "gpuguard/enforcer/pod_resources_reader.hpp"
#include "gpuguard/log/log.hpp"
#include "podresources/v1/api.pb.h"

namespace gpuguard::enforcer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kList = "/v1.PodResourcesLister/List";
constexpr const char* kGet = "/v1.PodResourcesLister/Get";
constexpr auto kRateLimitPause = std::chrono::milliseconds(15);  // a token every 10 ms at 100 a second

bool rate_limited(const grpc::Status& status) {
  // gRPC says RESOURCE_EXHAUSTED for an answer over its receive limit too, which no retry changes.
  return status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
         status.error_message().find("larger than max") == std::string::npos;
}

std::string describe(const char* call, const grpc::Status& status) {
  return std::string(call) + ": " + status.error_message() + " (code " + std::to_string(status.error_code()) + ")";
}

// One holder at a time, waited for until a deadline. Not std::timed_mutex: libstdc++ locks that with
// pthread_mutex_clocklock, which ThreadSanitizer does not see, so make test-tsan would report every unlock.
class Turn {
 public:
  bool take(Clock::time_point until) {
    std::unique_lock lock(mutex_);
    if (!freed_.wait_until(lock, until, [&] { return !taken_; })) return false;
    taken_ = true;
    return true;
  }
  void give_back() {
    {
      const std::lock_guard lock(mutex_);
      taken_ = false;
    }
    freed_.notify_one();
  }

 private:
  std::mutex mutex_;
  std::condition_variable freed_;
  bool taken_ = false;
};

// The turn, held for one scope when it was taken.
class HeldTurn {
 public:
  HeldTurn(Turn& turn, Clock::time_point until) : turn_(turn), held_(turn.take(until)) {}
  ~HeldTurn() {
    if (held_) turn_.give_back();
  }
  HeldTurn(const HeldTurn&) = delete;
  HeldTurn& operator=(const HeldTurn&) = delete;
  bool held() const { return held_; }

 private:
  Turn& turn_;
  bool held_;
};

}  // namespace

struct KubeletClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  grpc::GenericStub stub;
  // Whether the kubelet serves Get: unknown until it has answered one (true), or said it does not (false).
  std::atomic<int> get_served{-1};
  // One call and its answer at a time: the answers held at once are one, at most kMaxReceive.
  Turn one_at_a_time;

  explicit Impl(const std::shared_ptr<grpc::Channel>& c) : channel(c), stub(c) {}

  // One unary call, tried again while the kubelet's rate limit turns it away, until the deadline.
  grpc::Status call(const char* method, const std::string& request, grpc::ByteBuffer& response,
                    std::chrono::milliseconds deadline) {
    const auto until = Clock::now() + deadline;
    for (;;) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::duration_cast<std::chrono::system_clock::duration>(until - Clock::now()));
      grpc::Slice slice(request);
      const grpc::ByteBuffer sent(&slice, 1);
      grpc::CompletionQueue queue;
      auto reader = stub.PrepareUnaryCall(&context, method, sent, &queue);
      grpc::Status status;
      reader->StartCall();
      reader->Finish(&response, &status, reinterpret_cast<void*>(1));
      void* tag = nullptr;
      bool ok = false;
      queue.Next(&tag, &ok);
      queue.Shutdown();
      while (queue.Next(&tag, &ok)) {
      }
      if (!rate_limited(status) || Clock::now() + kRateLimitPause >= until) return status;
      std::this_thread::sleep_for(kRateLimitPause);
    }
  }

  // The answer's bytes as gRPC holds them, in its own slices: read in place.
  static std::string read(const grpc::ByteBuffer& response, const Wanted& wanted, const Take& take) {
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) return "the answer could not be read";
    std::vector<std::string_view> chunks;
    chunks.reserve(slices.size());
    for (const grpc::Slice& slice : slices) {
      chunks.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    return read_pod_resources(chunks, wanted, take);
  }
};

KubeletClient::KubeletClient(const std::filesystem::path& socket) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxReceive);
  impl_ = std::make_unique<Impl>(
      grpc::CreateCustomChannel("unix://" + socket.string(), grpc::InsecureChannelCredentials(), arguments));
}

KubeletClient::~KubeletClient() = default;

std::string KubeletClient::list(std::chrono::milliseconds deadline, const Wanted& wanted, const Take& take) {
  const auto until = Clock::now() + deadline;
  const HeldTurn turn(impl_->one_at_a_time, until);
  if (!turn.held()) return "List: another call to the kubelet took the deadline";
  deadline = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
  grpc::ByteBuffer response;
  const grpc::Status status = impl_->call(kList, {}, response, deadline);
  if (!status.ok()) return describe("List", status);
  const std::string error = Impl::read(response, wanted, take);
  return error.empty() ? error : "List: " + error;
}

std::optional<KubeletAnswer> KubeletClient::get(const std::string& pod_namespace, const std::string& pod_name,
                                                std::chrono::milliseconds deadline) {
  if (impl_->get_served.load() == 0) return std::nullopt;
  const auto until = Clock::now() + deadline;
  const HeldTurn turn(impl_->one_at_a_time, until);
  if (!turn.held()) return KubeletAnswer{false, std::nullopt, "Get: another call to the kubelet took the deadline"};
  deadline = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
  ::v1::GetPodResourcesRequest asked;
  asked.set_pod_name(pod_name);
  asked.set_pod_namespace(pod_namespace);
  const std::string request = asked.SerializeAsString();
  grpc::ByteBuffer response;
  const grpc::Status status = impl_->call(kGet, request, response, deadline);
  KubeletAnswer answer;
  if (!status.ok()) {
    const std::string& message = status.error_message();
    // A kubelet with KubeletPodResourcesGet off says so, as code Unknown: List answers there, from now on.
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
        message.find("Get method disabled") != std::string::npos) {
      if (impl_->get_served.exchange(0) != 0) log::info("the kubelet does not serve pod-resources Get: List answers");
      return std::nullopt;
    }
    // A pod the kubelet does not know is also code Unknown: "pod <name> in namespace <namespace> not found".
    if (status.error_code() == grpc::StatusCode::UNKNOWN && message.find(" not found") != std::string::npos) {
      impl_->get_served.store(1);
      answer.answered = true;
      return answer;
    }
    answer.error = describe("Get", status);
    return answer;
  }
  impl_->get_served.store(1);
  answer.error = Impl::read(
      response, [](std::string_view, std::string_view) { return true; },
      [&](std::string_view, std::string_view, PodResources pod) { answer.pod = std::move(pod); });
  answer.answered = answer.error.empty();
  if (!answer.answered) {
    answer.error = "Get: " + answer.error;
    answer.pod.reset();
  }
  return answer;
}

}  // namespace gpuguard::enforcer
