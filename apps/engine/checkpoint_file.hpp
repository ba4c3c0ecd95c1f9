// Opening a checkpoint's files by name: only regular files, and never
// blocking (opening a FIFO for reading waits for a writer). read_regular_file
// checks the descriptor it reads (a name can be swapped between a check and
// an open); check_regular_file checks a name that its caller then reopens
// (the safetensors reader's streams), which narrows that window but does
// not close it.
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
