#include "checkpoint_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine_error.hpp"

namespace ferrum::engine {
namespace {

// A read-only descriptor of a regular file, closed on scope exit.
class RegularFile {
 public:
  RegularFile(const std::filesystem::path& path, const std::string& where) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) {
      const int err = errno;
      fail(ErrorCode::InvalidArgument, where, ": cannot open it for reading (",
           err == ENOENT ? "no such file" : std::strerror(err), ")");
    }
    struct stat st{};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      fail(ErrorCode::InvalidArgument, where, ": cannot read its status (", std::strerror(err), ")");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(ErrorCode::InvalidArgument, where, ": not a regular file (",
           S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket", ")");
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile() { ::close(fd_); }
  int fd() const noexcept { return fd_; }
  std::uint64_t size() const noexcept { return size_; }

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace

std::uint64_t check_regular_file(const std::filesystem::path& path, const std::string& where) {
  return RegularFile(path, where).size();
}

std::string read_regular_file(const std::filesystem::path& path, const std::string& where, std::uint64_t max_bytes) {
  const RegularFile file(path, where);
  if (file.size() > max_bytes) {
    fail(ErrorCode::InvalidArgument, where, ": ", file.size(), " bytes is past the ", max_bytes, "-byte limit");
  }
  // Read to the end, but never past the limit (the file may grow meanwhile).
  std::string text;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(file.fd(), chunk, sizeof chunk);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::InvalidArgument, where, ": reading it failed (", std::strerror(errno), ")");
    }
    if (got == 0) break;
    text.append(chunk, static_cast<std::size_t>(got));
    if (text.size() > max_bytes) {
      fail(ErrorCode::InvalidArgument, where, ": it grew past the ", max_bytes, "-byte limit while being read");
    }
  }
  return text;
}

}  // namespace ferrum::engine
