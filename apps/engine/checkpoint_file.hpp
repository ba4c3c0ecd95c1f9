// Opening a checkpoint's files by name: only regular files, checked on the
// descriptor that is read (a name can be swapped between a check and an
// open), and never blocking (opening a FIFO for reading waits for a writer).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace ferrum::engine {

// Throws InvalidArgument, prefixed with `where` (e.g. "config '/a/b.json'"),
// unless `path` opens for reading as a regular file: no such file, a
// permission or link problem (with the system's reason), a directory, FIFO
// or device. Returns its size in bytes.
std::uint64_t check_regular_file(const std::filesystem::path& path, const std::string& where);

// The whole text of the regular file `path`, of at most `max_bytes` bytes
// (more: InvalidArgument naming the limit; nothing past it is read).
std::string read_regular_file(const std::filesystem::path& path, const std::string& where, std::uint64_t max_bytes);

}  // namespace ferrum::engine
