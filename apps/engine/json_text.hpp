// A JSON value as error messages quote it: bounded in depth, items and
// length. nlohmann's dump() recurses once per nesting level, so a hostile
// config.json or safetensors header nested 100 000 deep overflowed the stack
// while its error message was being built; a 100 MB value would have filled
// the message.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace ferrum::engine {

namespace json_text_detail {

inline constexpr std::size_t kMaxChars = 160;  // roughly: one item may end past it
inline constexpr int kMaxDepth = 3;
inline constexpr std::size_t kMaxItems = 8;

// A string as JSON, cut to kMaxChars bytes. The cut backs up to the start
// of a UTF-8 sequence: dump() throws on a string ending inside one (a
// foreign exception out of an error message), and the replace handler is a
// second guard.
inline void quote_string(const std::string& text, std::string& out) {
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  if (text.size() <= kMaxChars) {
    out += nlohmann::json(text).dump(-1, ' ', false, kReplace);
    return;
  }
  std::size_t cut = kMaxChars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a continuation byte
  out += nlohmann::json(text.substr(0, cut)).dump(-1, ' ', false, kReplace);
  out += "...";
}

inline void describe_into(const nlohmann::json& value, int depth, std::string& out) {
  if (value.is_string()) {
    quote_string(value.get_ref<const std::string&>(), out);
    return;
  }
  if (!value.is_array() && !value.is_object()) {
    out += value.dump();  // a number, bool or null: short, no recursion
    return;
  }
  const bool array = value.is_array();
  if (depth >= kMaxDepth) {
    out += array ? "[...]" : "{...}";
    return;
  }
  out += array ? '[' : '{';
  std::size_t items = 0;
  for (auto it = value.begin(); it != value.end(); ++it, ++items) {
    if (items > 0) out += ", ";
    if (items == kMaxItems || out.size() > kMaxChars) {
      out += "...";
      break;
    }
    if (!array) {
      quote_string(it.key(), out);
      out += ": ";
    }
    describe_into(*it, depth + 1, out);
  }
  out += array ? ']' : '}';
}

}  // namespace json_text_detail

// `value` as compact JSON, cut to a few levels, items and about 160
// characters ("..." where cut).
inline std::string describe_json(const nlohmann::json& value) {
  std::string out;
  json_text_detail::describe_into(value, 0, out);
  return out;
}

}  // namespace ferrum::engine
