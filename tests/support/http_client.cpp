#include "http_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

namespace gpuguard::test {

Reply http_request(unsigned short port, const std::string& method, const std::string& path, const std::string& body,
                   const std::string& content_type) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (method == "POST") {
    request += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  request += "\r\n" + body;
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer (413) and close before reading everything
    sent += static_cast<std::size_t>(n);
  }
  std::string response;
  char chunk[8192];
  for (;;) {
    const ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    // Under SO_RCVTIMEO the kernel does not restart a read that a signal for another thread interrupted.
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    response.append(chunk, static_cast<std::size_t>(n));
  }
  close(fd);
  Reply reply;
  if (response.size() > 12) reply.status = static_cast<unsigned>(std::stoi(response.substr(9, 3)));
  const std::size_t head_end = response.find("\r\n\r\n");
  if (head_end != std::string::npos) reply.body = response.substr(head_end + 4);
  return reply;
}

}  // namespace gpuguard::test
