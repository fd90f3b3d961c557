#pragma once
#include <simdjson.h>

#include "model.hpp"

namespace gpuguard::admission {

// Would a review with these request fields be mutated at all? Anything else is allowed untouched,
// and its `object` is never decoded.
bool is_mutable_pod_request(const Review& review);

namespace dom = simdjson::dom;

// Throws DecodeError for input that is not JSON or not an AdmissionReview of a known version. The
// Review's strings are views into `parser`'s document: valid until the parser parses again.
Review decode_review(dom::parser& parser, simdjson::padded_string_view json);

}  // namespace gpuguard::admission
