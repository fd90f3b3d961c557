// Writes a benchmark review of at least N KiB to standard output, for the load benchmark.
#include <cstdlib>
#include <iostream>

#include "review_documents.hpp"

int main(int argc, char** argv) {
  const long kib = argc > 1 ? std::atol(argv[1]) : 8;
  std::cout << gpuguard::bench::review_of_size(static_cast<std::size_t>(kib) * 1024);
}
