// Where a byte string stops being UTF-8 text, by the rules the char tokenizer reads characters
// with (data/tokenizer.h; defined beside them in tokenizer.cpp).
#pragma once
#include <cstddef>
#include <string_view>

namespace qkv {

// The byte offset of the first byte that makes `text` not UTF-8 text: a NUL, or a byte that does
// not start a valid UTF-8 sequence (RFC 3629); npos when there is none. Every tokenizer still
// encodes such input exactly; this is for saying so.
size_t first_non_text_byte(std::string_view text);

}  // namespace qkv
