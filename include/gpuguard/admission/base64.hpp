#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace gpuguard::admission {

// Standard alphabet with padding: what encoding/json does with a []byte such as response.patch.
std::string base64_encode(std::string_view bytes);
void base64_encode(std::string_view bytes, std::string& out);  // appends to `out`
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace gpuguard::admission
