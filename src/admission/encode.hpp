#pragma once
#include <string>

#include "decide.hpp"

namespace gpuguard::admission {

// The JSON Patch document (RFC 6902) for a decision, written over `out`; "[]" when it has no operations.
void encode_patch(const Decision& decision, const Policy& policy, std::string& out);

// The AdmissionReview response: same apiVersion as the request, uid echoed, patchType only with a patch.
std::string encode_response(const Review& review, const Decision& decision, const Policy& policy);

}  // namespace gpuguard::admission
