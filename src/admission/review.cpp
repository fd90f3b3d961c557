#include "gpuguard/admission/review.hpp"

#include <simdjson.h>

#include "decide.hpp"
#include "decode.hpp"
#include "encode.hpp"

namespace gpuguard::admission {
namespace {

// A simdjson parser keeps buffers sized for the largest document it has seen. Each thread keeps one
// for the usual few-KiB reviews; rare large ones get a parser of their own so memory does not stay high.
constexpr std::size_t kReusableParserLimit = std::size_t{256} * 1024;

simdjson::ondemand::parser& reusable_parser() {
  thread_local simdjson::ondemand::parser parser;
  return parser;
}

}  // namespace

ReviewOutcome review(std::string body, const policy::Policy& policy) {
  ReviewOutcome outcome;
  const std::size_t length = body.size();
  body.reserve(length + simdjson::SIMDJSON_PADDING);
  const simdjson::padded_string_view json(body.data(), length, body.capacity());
  try {
    simdjson::ondemand::parser large_document_parser;  // allocates nothing until used
    simdjson::ondemand::parser& parser = length <= kReusableParserLimit ? reusable_parser() : large_document_parser;
    const Review request = decode_review(parser, json);
    const Decision decision = decide(request, policy);
    outcome.body = encode_response(request, decision, policy);
    outcome.ok = true;
    outcome.uid = request.uid;
    outcome.operation = request.operation;
    outcome.allowed = decision.allowed;
    outcome.denial = decision.denial;
    outcome.patched = !decision.patch.empty();
    outcome.warnings = decision.warnings.size();
    for (Mutation mutation : decision.mutations) ++outcome.mutations[static_cast<std::size_t>(mutation)];
  } catch (const DecodeError& error) {
    outcome.body = error.what();
  } catch (const simdjson::simdjson_error& error) {
    outcome.body = std::string("malformed JSON (") + error.what() + ")";
  }
  return outcome;
}

}  // namespace gpuguard::admission
