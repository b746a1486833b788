// The one HTML escape the analysis reports (leakcheck, heads, study) use for text they embed.
#pragma once
#include <string>

namespace qkv::analysis {

// s with &, <, > and " replaced by their character references.
inline std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += ch;
    }
  }
  return o;
}

}  // namespace qkv::analysis
