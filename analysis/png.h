// A small RGB canvas for the pictures qkv draws (attention maps): filled rectangles, text in a
// built-in 5x7 bitmap font (printable ASCII, plus '\n' drawn as a return arrow and '\x01' as a
// visible space), and PNG encoding through libpng's simplified API. Writes are atomic.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::analysis {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

class Image {
 public:
  Image(int width, int height, Rgb background = {255, 255, 255});
  int width() const { return width_; }
  int height() const { return height_; }
  void set(int x, int y, Rgb c);  // outside the canvas: ignored
  Rgb get(int x, int y) const;
  void fill_rect(int x, int y, int w, int h, Rgb c);  // clipped to the canvas
  // Glyphs are 5x7 pixels in a 6x8 cell, times `scale`. Characters without a glyph draw as '?'.
  // Returns the width drawn.
  int draw_text(int x, int y, std::string_view text, Rgb c, int scale = 1);
  // One character under the other, for column labels.
  void draw_text_vertical(int x, int y, std::string_view text, Rgb c, int scale = 1);
  static int text_width(std::string_view text, int scale = 1) { return static_cast<int>(text.size()) * 6 * scale; }
  static constexpr int kGlyphW = 6, kGlyphH = 8;               // cell size at scale 1
  const std::vector<uint8_t>& pixels() const { return rgb_; }  // row-major RGB

 private:
  void draw_char(int x, int y, unsigned char ch, Rgb c, int scale);
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

// PNG bytes of `img` (8-bit RGB). Throws qkv::Error naming libpng's message on failure.
std::string encode_png(const Image& img);
// Encodes and writes `path` atomically.
void write_png(const std::string& path, const Image& img);
// Reads any PNG libpng understands, converted to 8-bit RGB (tests and tools).
Image read_png(const std::string& path);

}  // namespace qkv::analysis
